package zgomlx

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/checkpoint"
)

// MetaDTypes is the checkpoint metadata key holding each variable's
// GoMLX dtype (a JSON object by path), so a reader knows the Store's
// dtypes besides zinf's param dtype.
const MetaDTypes = "gomlx.dtypes"

// ModelShape returns every registered variable's full shape by name, as
// zinf checkpoints record it (zinf.CheckpointMeta.ModelShape).
func (o *Offload) ModelShape() map[string][]int64 {
	out := make(map[string][]int64, len(o.vars))
	for _, v := range o.vars {
		dims := make([]int64, len(v.Shape.Dimensions))
		for i, d := range v.Shape.Dimensions {
			dims[i] = int64(d)
		}
		out[v.Name] = dims
	}
	return out
}

// SaveCheckpoint saves the variables' values and optimizer states as the
// checkpoint dir (zinf.SaveCheckpoint: safetensors files, crash-safe
// commit) with each variable's shape filled in and its GoMLX dtype in the
// metadata. step is where a resumed loop continues. Call it between steps.
func (o *Offload) SaveCheckpoint(ctx context.Context, dir string, step int64, opts checkpoint.SaveOptions) (*checkpoint.Manifest, error) {
	dts := make(map[string]string, len(o.vars))
	for _, v := range o.vars {
		dts[v.Name] = v.Shape.DType.String()
	}
	js, err := json.Marshal(dts)
	if err != nil {
		return nil, err
	}
	meta := zinf.CheckpointMeta{Step: step, ModelShape: o.ModelShape(), User: map[string]string{MetaDTypes: string(js)}}
	return zinf.SaveCheckpoint(ctx, dir, []*zinf.Runtime{o.rt}, meta, opts)
}

// LoadCheckpoint restores the variables and optimizer states from the
// checkpoint dir and returns the step it was saved at. The saved shapes
// (and GoMLX dtypes, when recorded) must be the registered variables';
// a mismatch is reported by variable before anything changes. Call it
// between steps; swap-in buffers see the loaded values.
func (o *Offload) LoadCheckpoint(ctx context.Context, dir string) (int64, error) {
	r, err := checkpoint.OpenRank(dir, 0)
	if err != nil {
		return 0, err
	}
	err = r.CheckModelShape(o.ModelShape())
	if err == nil {
		err = o.checkDTypes(r.Meta().User[MetaDTypes])
	}
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("zgomlx: checkpoint %s: %w", dir, err)
	}
	meta, err := zinf.LoadCheckpoint(ctx, dir, []*zinf.Runtime{o.rt})
	o.version++ // whatever was loaded, the buffers' values are stale
	if err != nil {
		return 0, err
	}
	return meta.Step, nil
}

// checkDTypes compares recorded GoMLX dtypes with the variables'.
func (o *Offload) checkDTypes(js string) error {
	if js == "" {
		return nil
	}
	var saved map[string]string
	if err := json.Unmarshal([]byte(js), &saved); err != nil {
		return fmt.Errorf("metadata %s: %w", MetaDTypes, err)
	}
	for _, v := range o.vars {
		if d, ok := saved[v.Name]; ok && d != v.Shape.DType.String() {
			return fmt.Errorf("%w: variable %q was saved as %s, the Store has %s", checkpoint.ErrShape, v.Name, d, v.Shape.DType)
		}
	}
	return nil
}
