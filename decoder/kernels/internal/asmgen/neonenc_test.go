package main

import "testing"

// TestNEONEncodings holds the hand encoders to the words LLVM's
// assembler (llvm-mc -triple=aarch64 -mattr=+dotprod -show-encoding)
// gives for the same instructions, registers low and high, and their
// comments to the assembler's text.
func TestNEONEncodings(t *testing.T) {
	type enc = func() (uint32, string)
	for _, c := range []struct {
		f    enc
		text string
		word uint32
	}{
		{func() (uint32, string) { return encSMULL(6, 0, 4, false, false) }, "smull v6.8h, v0.8b, v4.8b", 0x0e24c006},
		{func() (uint32, string) { return encSMULL(31, 17, 9, true, false) }, "smull2 v31.8h, v17.16b, v9.16b", 0x4e29c23f},
		{func() (uint32, string) { return encSMULL(1, 2, 30, false, true) }, "umull v1.8h, v2.8b, v30.8b", 0x2e3ec041},
		{func() (uint32, string) { return encSMULL(7, 0, 4, true, true) }, "umull2 v7.8h, v0.16b, v4.16b", 0x6e24c007},
		{func() (uint32, string) { return encSADDLP(6, 6) }, "saddlp v6.4s, v6.8h", 0x4e6028c6},
		{func() (uint32, string) { return encSADDLP(31, 12) }, "saddlp v31.4s, v12.8h", 0x4e60299f},
		{func() (uint32, string) { return encSDOT(16, 0, 4, false) }, "sdot v16.4s, v0.16b, v4.16b", 0x4e849410},
		{func() (uint32, string) { return encSDOT(8, 31, 5, false) }, "sdot v8.4s, v31.16b, v5.16b", 0x4e8597e8},
		{func() (uint32, string) { return encSDOT(2, 3, 29, true) }, "udot v2.4s, v3.16b, v29.16b", 0x6e9d9462},
		{func() (uint32, string) { return encSCVTF(6, 6) }, "scvtf v6.4s, v6.4s", 0x4e21d8c6},
		{func() (uint32, string) { return encSCVTF(30, 9) }, "scvtf v30.4s, v9.4s", 0x4e21d93e},
		{func() (uint32, string) { return encFMLAElem(16, 6, 25) }, "fmla v16.4s, v6.4s, v25.s[0]", 0x4f9910d0},
		{func() (uint32, string) { return encFMLAElem(3, 31, 7) }, "fmla v3.4s, v31.4s, v7.s[0]", 0x4f8713e3},
		{func() (uint32, string) { return encFMULElem(6, 6, 27) }, "fmul v6.4s, v6.4s, v27.s[0]", 0x4f9b90c6},
		{func() (uint32, string) { return encFADD(17, 17, 8) }, "fadd v17.4s, v17.4s, v8.4s", 0x4e28d631},
		{func() (uint32, string) { return encSXTL(6, 6, false) }, "sshll v6.4s, v6.4h, #0", 0x0f10a4c6},
		{func() (uint32, string) { return encSXTL(8, 6, true) }, "sshll2 v8.4s, v6.8h, #0", 0x4f10a4c8},
		{func() (uint32, string) { return encSXTL(31, 17, false) }, "sshll v31.4s, v17.4h, #0", 0x0f10a63f},
	} {
		w, text := c.f()
		if w != c.word || text != c.text {
			t.Errorf("%s: %#08x %q, want %#08x", c.text, w, text, c.word)
		}
	}
}

// TestNEONEncodingsCheckRegisters requires the encoders to refuse a
// register number outside V0-V31 (a mistake of the generator) rather
// than print a wrong word for it.
func TestNEONEncodingsCheckRegisters(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("encSCVTF(32, 0) did not panic")
		}
	}()
	encSCVTF(32, 0)
}
