package h1

import (
	"bufio"
	"errors"
	"io"
)

// ErrChunked: a malformed chunked body.
var ErrChunked = errors.New("malformed chunked body")

// ReadChunkSize reads a chunk's size line (extensions ignored).
func ReadChunkSize(br *bufio.Reader) (int64, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return 0, ErrChunked
		}
		if errors.Is(err, io.EOF) {
			return 0, io.ErrUnexpectedEOF
		}
		return 0, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return 0, ErrChunked
	}
	line = line[:len(line)-2]
	for i, c := range line {
		if c == ';' {
			line = line[:i]
			break
		}
	}
	// BWS may come before an extension (RFC 9112 7.1.1), and is taken
	// at the end as net/http does; never before the size.
	for len(line) > 0 && (line[len(line)-1] == ' ' || line[len(line)-1] == '\t') {
		line = line[:len(line)-1]
	}
	if len(line) == 0 || len(line) > 15 {
		return 0, ErrChunked
	}
	var n int64
	for _, c := range line {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, ErrChunked
		}
		n = n<<4 | int64(c)
	}
	return n, nil
}

// ReadCRLF reads the CRLF after a chunk's data.
func ReadCRLF(br *bufio.Reader) error {
	b, err := br.Peek(2)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	if b[0] != '\r' || b[1] != '\n' {
		return ErrChunked
	}
	_, _ = br.Discard(2)
	return nil
}

// maxTrailers bounds a chunked body's trailer section (dropped).
const maxTrailers = 64 << 10

// ReadTrailers reads a chunked body's trailer fields and the empty line
// that ends it; they are dropped (as they always were).
func ReadTrailers(br *bufio.Reader) error {
	total := 0
	for {
		line, err := br.ReadSlice('\n')
		total += len(line)
		if err != nil || total > maxTrailers {
			if err == nil || errors.Is(err, bufio.ErrBufferFull) {
				return ErrChunked
			}
			if errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		if len(line) < 2 || line[len(line)-2] != '\r' {
			return ErrChunked
		}
		if len(line) == 2 {
			return nil
		}
	}
}
