package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/gomlx/gomlx/core/tensors"
	"github.com/tiktoken-go/tokenizer"
)

// The text: the King James Bible of Debian's bible-kjv-text (its
// compressed data file), read with bible-kjv's reader, /usr/bin/bible.
const (
	bibleData   = "/usr/lib/bible.data"
	bibleReader = "bible"
	// bibleRange is every verse, Genesis to Revelation.
	bibleRange = "gen1:1-rev22:21"
)

// errNoBible says how to get the text.
var errNoBible = errors.New("the King James Bible is not installed (apt-get install -y bible-kjv-text bible-kjv; make demo-llm installs them)")

// bibleVerses returns the verses of the books in order, each verse's text
// without its number, one verse per element.
func bibleVerses() ([]string, error) {
	if _, err := os.Stat(bibleData); err != nil {
		return nil, fmt.Errorf("%w: %v", errNoBible, err)
	}
	path, err := exec.LookPath(bibleReader)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoBible, err)
	}
	cmd := exec.Command(path, "-l", "10000", bibleRange)
	cmd.Env = append(os.Environ(), "COLUMNS=10000")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", path, bibleRange, err)
	}
	var verses []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		// "  12 And God said, ..." starts a verse; a line without a
		// leading number is a book and chapter heading or a
		// continuation of the verse before it.
		num, rest, ok := strings.Cut(line, " ")
		if ok && num != "" && strings.Trim(num, "0123456789") == "" {
			verses = append(verses, strings.TrimSpace(rest))
			continue
		}
		if len(verses) > 0 && line != "" && !isHeading(line) {
			verses[len(verses)-1] += " " + line
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(verses) < 30000 {
		return nil, fmt.Errorf("%s printed %d verses (the King James Bible has 31102)", path, len(verses))
	}
	return verses, nil
}

// isHeading reports a "Genesis 1" style line.
func isHeading(line string) bool {
	i := strings.LastIndexByte(line, ' ')
	return i > 0 && strings.Trim(line[i+1:], "0123456789") == "" && !strings.ContainsAny(line, ".,;:")
}

// corpus is the tokenized text: a training part and a held-out part.
type corpus struct {
	enc             tokenizer.Codec
	vocab           int
	train, heldOut  []int32
	verses, heldOff int
}

// tokenizerVocab is cl100k_base's vocabulary size: its largest token id
// (<|endofprompt|>, 100276) plus one.
const tokenizerVocab = 100277

// loadCorpus tokenizes the first verses of the Bible with cl100k_base
// (GPT-4's BPE, embedded in the tokenizer module: nothing is fetched at
// run time), one verse per line; the last heldOut verses of them are the
// held-out split.
func loadCorpus(verses, heldOut int) (*corpus, error) {
	all, err := bibleVerses()
	if err != nil {
		return nil, err
	}
	if verses > len(all) || heldOut >= verses {
		return nil, fmt.Errorf("--verses %d, --held-out %d (allowed: held-out < verses <= %d)", verses, heldOut, len(all))
	}
	enc, err := tokenizer.Get(tokenizer.Cl100kBase)
	if err != nil {
		return nil, err
	}
	c := &corpus{enc: enc, vocab: tokenizerVocab, verses: verses, heldOff: heldOut}
	encode := func(vs []string) ([]int32, error) {
		ids, _, err := enc.Encode(strings.Join(vs, "\n") + "\n")
		if err != nil {
			return nil, err
		}
		out := make([]int32, len(ids))
		for i, id := range ids {
			if id >= tokenizerVocab {
				return nil, fmt.Errorf("token id %d outside the vocabulary of %d", id, tokenizerVocab)
			}
			out[i] = int32(id)
		}
		return out, nil
	}
	if c.train, err = encode(all[:verses-heldOut]); err != nil {
		return nil, err
	}
	if c.heldOut, err = encode(all[verses-heldOut : verses]); err != nil {
		return nil, err
	}
	return c, nil
}

// batch cuts batch windows of seq+1 tokens from toks, window k of the
// call starting at a position drawn from (step, k); x is each window's
// first seq tokens, y the next token of each.
func batch(toks []int32, step, b, seq int) (x, y *tensors.Tensor) {
	xs := make([]int32, b*seq)
	ys := make([]int32, b*seq)
	span := len(toks) - seq - 1
	for k := range b {
		h := uint64(step*b+k+1) * 0x9E3779B97F4A7C15
		h ^= h >> 29
		start := int(h % uint64(span))
		copy(xs[k*seq:], toks[start:start+seq])
		copy(ys[k*seq:], toks[start+1:start+seq+1])
	}
	return tensors.FromFlatDataAndDimensions(xs, b, seq), tensors.FromFlatDataAndDimensions(ys, b, seq)
}

// heldOutBatches are consecutive windows of the held-out tokens.
func heldOutBatches(toks []int32, n, b, seq int) (xs, ys []*tensors.Tensor) {
	pos := 0
	for range n {
		x := make([]int32, b*seq)
		y := make([]int32, b*seq)
		for k := range b {
			if pos+seq+1 > len(toks) {
				pos = 0
			}
			copy(x[k*seq:], toks[pos:pos+seq])
			copy(y[k*seq:], toks[pos+1:pos+seq+1])
			pos += seq
		}
		xs = append(xs, tensors.FromFlatDataAndDimensions(x, b, seq))
		ys = append(ys, tensors.FromFlatDataAndDimensions(y, b, seq))
	}
	return xs, ys
}
