package worker

// topString returns the value of key in the JSON object data if key is a
// member of the object itself (not of one nested in it) and its value is
// a string without escapes. For anything else (another shape, an escape,
// no such member, bad JSON) ok is false and the caller decodes data as
// before: this only spares a decode where its answer is certain.
func topString(data []byte, key string) (val string, ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return "", false
	}
	i++
	for {
		i = skipSpace(data, i)
		k, end, plain := rawString(data, i)
		if !plain {
			return "", false
		}
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return "", false
		}
		i = skipSpace(data, i+1)
		if string(k) == key {
			v, _, plain := rawString(data, i)
			if !plain {
				return "", false
			}
			return string(v), true
		}
		if i, ok = skipValue(data, i); !ok {
			return "", false
		}
		i = skipSpace(data, i)
		if i >= len(data) || data[i] != ',' {
			return "", false // the object ends without key
		}
		i++
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// rawString reads the string at data[i], returning its bytes and the index
// after it; plain is false if there is no string there or it has an
// escape.
func rawString(data []byte, i int) (s []byte, end int, plain bool) {
	if i >= len(data) || data[i] != '"' {
		return nil, i, false
	}
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			return nil, i, false
		case '"':
			return data[i+1 : j], j + 1, true
		}
	}
	return nil, i, false
}

// skipValue returns the index after the value at data[i]: a string, an
// object or array (whatever they hold), or a literal or number.
func skipValue(data []byte, i int) (int, bool) {
	depth := 0
	for i < len(data) {
		switch c := data[i]; c {
		case '"':
			j := i + 1
			for ; j < len(data) && data[j] != '"'; j++ {
				if data[j] == '\\' {
					j++
				}
			}
			if j >= len(data) {
				return i, false
			}
			i = j + 1
		case '{', '[':
			depth++
			i++
		case '}', ']':
			if depth == 0 {
				return i, true // the end of the enclosing object: a literal ended here
			}
			depth--
			i++
		case ',':
			if depth == 0 {
				return i, true
			}
			i++
		default:
			i++
		}
		if depth == 0 && (i >= len(data) || data[i] == ',' || data[i] == '}' || data[i] == ' ' || data[i] == '\n' || data[i] == '\r' || data[i] == '\t') {
			return i, true
		}
	}
	return i, depth == 0
}
