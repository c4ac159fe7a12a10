// Package schedule holds what changes from one optimizer step to the next
// besides the weights: DeepSpeed's learning-rate schedules and its fp16
// loss scaler. zinf.Runtime uses both (from the config's "scheduler" and
// "fp16" sections); an in-memory reference loop uses them to take the same
// steps.
//
// # Use
//
//	sched, _ := schedule.FromConfig(cfg)         // Constant(optimizer.params.lr) without a scheduler
//	scaler, _ := schedule.NewLossScalerFromConfig(cfg)
//	for applied := 0; ; {
//		loss *= scaler.Scale()                   // before backward (1 without fp16)
//		...
//		if overflow {                            // any gradient inf or NaN (fp16 only)
//			scaler.Update(true)                  // the step is skipped
//			continue
//		}
//		applied++
//		lr := sched.At(applied).LR               // applied steps only
//		... unscale, clip, update with lr ...
//		scaler.Update(false)
//	}
//
// # Schedules
//
// DeepSpeed builds its scheduler at last_batch_iteration -1 (setting the
// constructor's rate) and steps it after each applied optimizer step (not
// after one skipped for an fp16 overflow). So applied step k runs at
// iteration it = k - 2, and step 1 at the constructor's rate. All
// arithmetic is float64, in DeepSpeed's order of operations; the optimizer
// rounds the rate to float32 once. With W = max(2, warmup_num_steps),
// T = total_num_steps and
//
//	gamma(it) = (1/ln(W)) * ln(it+1)     warmup_type "log"
//	gamma(it) = it / W                   warmup_type "linear"
//
// the rates are:
//
//	WarmupLR        it < 0: min;  it < W: min + (max-min)*gamma(it);  else min + (max-min)*1.0
//	WarmupDecayLR   as WarmupLR up to W; then min + (max-min) * max(0, (T-it) / max(1, T-W))
//	WarmupCosineLR  it < 0: 0;  it < W: lr * (wmin + gamma(it)*(1-wmin));
//	                else lr * max(0, cmin + (1-cmin) * (1 + cos(pi*p))/2),  p = min(1, (it-W+1) / max(1, T-W))
//
// with min, max = warmup_min_lr, warmup_max_lr; wmin, cmin =
// warmup_min_ratio, cos_min_ratio; lr = optimizer.params.lr. OneCycle,
// with F, B = cycle_first_step_size, cycle_second_step_size, total = F+B:
//
//	it < 0:      lr = cycle_min_lr, beta1 = cycle_min_mom
//	it < total:  bi = it+1; cycle = floor(1 + bi/total); x = 1 + bi/total - cycle
//	             s = x/(F/total) when x <= F/total, else (x-1)/(F/total - 1)
//	             with a stair count n > 0 for that half: ci = bi mod total;
//	             s = floor(ci*n/F)/n (rising) or floor((total-ci)*n/B)/n (falling)
//	             lr = cycle_min_lr + (cycle_max_lr - cycle_min_lr)*s
//	             beta1 = cycle_max_mom - (cycle_max_mom - cycle_min_mom)*s
//	after:       d = it - total + 1
//	             lr = cycle_min_lr / (1 + decay_lr_rate*(d/decay_step_size))   (cycle_min_lr when either is 0)
//	             beta1 = cycle_max_mom * (1 + decay_mom_rate*(d/decay_step_size)) (cycle_max_mom when either is 0)
//
// With momentum cycling (cycle_momentum, for optimizers with betas)
// DeepSpeed writes the optimizer's betas as (beta1, 0.99): beta2 becomes
// 0.99 whatever the optimizer's config says, and zinf does the same.
// Optimizers without betas get no momentum cycling (DeepSpeed warns and
// turns it off). LRRangeTest is not implemented.
//
// The golden test compares every schedule with DeepSpeed's formulas
// evaluated in Python and, where torch.optim.lr_scheduler has the same
// shape (LinearLR, CosineAnnealingLR, CyclicLR), with torch's closed forms;
// scripts/schedule_golden.py regenerates the file.
//
// # Loss scaling
//
// LossScaler follows DeepSpeed's DynamicLossScaler (see Update for the
// exact rule): the scale starts at 2^initial_scale_power, halves (not
// below min_loss_scale) once hysteresis overflows have been seen, and
// doubles on the clean step that follows loss_scale_window clean steps
// (then every loss_scale_window clean steps). An overflow with the scale
// already at min_loss_scale is ErrLossScaleAtMinimum, as DeepSpeed raises.
// A static scale (fp16.loss_scale > 0) never changes. Without fp16 the
// scale is 1 and there is no overflow check: bf16 needs no loss scaling.
package schedule
