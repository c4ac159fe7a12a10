package promscrape

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	in := `# HELP x help
# TYPE x counter
x{a="1",b="q\"uote"} 3
x{a="2",b=""} 4.5
y 1e3
z_bucket{le="+Inf"} 7
`
	s, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 4 || s[0].Labels["b"] != `q"uote` || s[2].Value != 1000 || s[3].Labels["le"] != "+Inf" {
		t.Fatalf("%+v", s)
	}
	if v, ok := s.Sum("x", nil); !ok || v != 7.5 {
		t.Fatalf("sum x = %v %v", v, ok)
	}
	if v, ok := s.Sum("x", map[string]string{"a": "2"}); !ok || v != 4.5 {
		t.Fatalf("sum x{a=2} = %v %v", v, ok)
	}
	if _, ok := s.Sum("x", map[string]string{"a": "3"}); ok {
		t.Fatal("matched a missing series")
	}
	for _, bad := range []string{"x", `x{a="1} 2`, "x{a} 1", "x abc"} {
		if _, err := Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
