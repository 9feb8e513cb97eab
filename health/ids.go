package health

import (
	"slices"
	"sort"
)

// idChunk is the size a chunk of sortedIDs splits at (twice this) and is
// split to.
const idChunk = 256

// sortedIDs is a set of ids in order, for the pages of the rotation and
// the snapshot's order, without sorting the fleet per read: sorted chunks
// of at most 2*idChunk ids, the chunks in order. Insert and Delete cost a
// binary search over the chunks and a move within one chunk, O(log n +
// idChunk); After walks from an id in O(log n) plus what it visits.
type sortedIDs struct {
	chunks [][]string
	n      int
}

// Len is the number of ids.
func (s *sortedIDs) Len() int { return s.n }

// chunkFor is the index of the chunk id belongs in: the last one whose
// first id is not after it (the first chunk if none).
func (s *sortedIDs) chunkFor(id string) int {
	i := sort.Search(len(s.chunks), func(i int) bool { return s.chunks[i][0] > id })
	return max(i-1, 0)
}

// Insert adds id and reports whether it was new.
func (s *sortedIDs) Insert(id string) bool {
	if len(s.chunks) == 0 {
		s.chunks = [][]string{{id}}
		s.n = 1
		return true
	}
	ci := s.chunkFor(id)
	c := s.chunks[ci]
	j, found := slices.BinarySearch(c, id)
	if found {
		return false
	}
	c = slices.Insert(c, j, id)
	if len(c) > 2*idChunk {
		// Split: the second half gets an array of its own, so that
		// an insert into the first never writes over it.
		second := slices.Clone(c[idChunk:])
		c = c[:idChunk:idChunk]
		s.chunks = slices.Insert(s.chunks, ci+1, second)
	}
	s.chunks[ci] = c
	s.n++
	return true
}

// Delete removes id and reports whether it was there.
func (s *sortedIDs) Delete(id string) bool {
	if len(s.chunks) == 0 {
		return false
	}
	ci := s.chunkFor(id)
	c := s.chunks[ci]
	j, found := slices.BinarySearch(c, id)
	if !found {
		return false
	}
	c = slices.Delete(c, j, j+1)
	s.n--
	switch {
	case len(c) == 0:
		s.chunks = slices.Delete(s.chunks, ci, ci+1)
		return true
	case ci+1 < len(s.chunks) && len(c)+len(s.chunks[ci+1]) <= idChunk:
		// Merge small neighbours, so that churn does not leave the
		// set in many tiny chunks.
		c = append(c, s.chunks[ci+1]...)
		s.chunks = slices.Delete(s.chunks, ci+1, ci+2)
	}
	s.chunks[ci] = c
	return true
}

// After calls fn with every id after after ("" for all), in order, until
// fn returns false.
func (s *sortedIDs) After(after string, fn func(id string) bool) {
	if len(s.chunks) == 0 {
		return
	}
	ci, j := 0, 0
	if after != "" {
		ci = s.chunkFor(after)
		j, _ = slices.BinarySearch(s.chunks[ci], after)
		if j < len(s.chunks[ci]) && s.chunks[ci][j] == after {
			j++
		}
	}
	for ; ci < len(s.chunks); ci, j = ci+1, 0 {
		for _, id := range s.chunks[ci][j:] {
			if !fn(id) {
				return
			}
		}
	}
}
