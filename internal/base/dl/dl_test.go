package dl_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/zinfio/zinf/internal/base/dl"
	"github.com/zinfio/zinf/internal/test/cudatest"
)

func TestLoad(t *testing.T) {
	cudatest.RequireCgo(t)
	lib := "libm.so.6"
	self := func(l *dl.Library) *dl.Library { return l }
	c := dl.NewCache([]dl.Symbol{
		{Name: "cos", Required: true},
		{Name: "zinf_no_such_symbol", Fallback: "sin", Required: true},
		{Name: "zinf_optional_missing"},
	}, self)
	l, err := c.Load(lib)
	if err != nil {
		t.Skipf("%s not loadable here: %v", lib, err)
	}
	if l.Path() != lib || l.Table() == nil || !l.Has(0) || !l.Has(1) || l.Has(2) || l.Has(3) {
		t.Fatalf("library %q: table %v, has cos %v, has sin via fallback %v, has optional %v",
			l.Path(), l.Table(), l.Has(0), l.Has(1), l.Has(2))
	}
	again, err := c.Load(lib)
	if err != nil || again != l {
		t.Fatalf("second load: %p %v; want the same library %p", again, err, l)
	}

	_, err = dl.NewCache([]dl.Symbol{{Name: "cos", Required: true}, {Name: "zinf_required_missing", Required: true}}, self).Load(lib)
	var me *dl.MissingSymbolError
	if !errors.As(err, &me) || me.Symbol != "zinf_required_missing" || me.Path != lib {
		t.Fatalf("missing required symbol: %v; want a *MissingSymbolError naming it", err)
	}

	missing := filepath.Join(t.TempDir(), "libnothing.so")
	_, err = c.Load(missing)
	var oe *dl.OpenError
	if !errors.As(err, &oe) || oe.Path != missing || oe.Reason == "" {
		t.Fatalf("missing library: %v; want an *OpenError with dlerror's reason", err)
	}
}
