package zinf

import (
	"fmt"

	"github.com/zinfio/zinf/accel/cuda"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/gds"
	"github.com/zinfio/zinf/plan"
)

// openDeviceIO builds r.deviceIO when the config selects GPUDirect Storage
// (plan.GDSMode "auto" or "required"); with "off" it leaves it nil and device
// transfers take the bounce path through the pinned pool, as they always
// did. It needs r.pool, r.Engine and r.device.
//
//   - "auto": cuFile when r.device is a CUDA device and gds.Available says
//     it works; otherwise the bounce path (NVMe -> pinned host buffer ->
//     device) with exactly one warning saying why.
//   - "required": cuFile, or an error carrying Available's diagnosis, and
//     Open fails.
//
// The bounce path holds 2 x aio.intra_op_parallelism staging buffers of
// aio.block_size from the pool for the Runtime's life.
func (r *Runtime) openDeviceIO(s *plan.Settings) error {
	log := r.log
	mode, err := gds.ParseMode(s.GDSMode)
	if err != nil {
		return fmt.Errorf("zinf: zinf.gds: %w", err)
	}
	if mode == gds.ModeOff {
		return nil
	}
	opts := gds.SelectOptions{GDS: s.GDS, Bounce: s.Bounce, AIO: r.Engine, Pool: r.pool, Logger: log}
	opts.GDS.Logger, opts.Bounce.Logger = log, log
	selectMode := mode
	if _, isCUDA := r.device.(*cuda.Device); !isCUDA {
		// GPUDirect Storage moves data into GPU memory only. Say what this
		// machine lacks for it (Available's diagnosis: the cuFile library,
		// a GPU, the nvidia-fs driver, the filesystem), which is more use
		// than "the device is simulated".
		reason := gds.Available(opts.GDS)
		if reason == nil {
			reason = fmt.Errorf("gds: device %s is not a CUDA device; GPUDirect Storage moves data to GPU memory only (set zinf.device to \"cuda\" or \"auto\"): %w",
				r.device.Name(), gds.ErrUnavailable)
		}
		if mode == gds.ModeRequired {
			return fmt.Errorf("zinf: zinf.gds is \"required\" but GPUDirect Storage cannot be used with device %s: %w", r.device.Name(), reason)
		}
		log.Warn("zinf: zinf.gds is \"auto\" but GPUDirect Storage is unavailable; device transfers use the bounce path (NVMe -> pinned host buffer -> device)",
			"device", r.device.Name(), "reason", reason.Error())
		selectMode = gds.ModeOff
	}
	before := r.pool.Stats().InUseBytesByPurpose[buffers.PurposeStaging]
	dio, err := gds.Select(selectMode, r.device, opts)
	if err != nil {
		if mode == gds.ModeRequired {
			return fmt.Errorf("zinf: zinf.gds is \"required\": %w", err)
		}
		return fmt.Errorf("zinf: zinf.gds is %q: building the bounce path: %w", mode, err)
	}
	r.deviceIO = dio
	r.deviceIOStagingBytes = r.pool.Stats().InUseBytesByPurpose[buffers.PurposeStaging] - before
	log.Debug("zinf: device I/O ready", "mode", dio.Mode(), "device", r.device.Name(), "staging_bytes", r.deviceIOStagingBytes)
	return nil
}

// closeDeviceIO closes r.deviceIO: it must run after the swappers that use
// it and before the engine, pool and device it was built over.
func (r *Runtime) closeDeviceIO() error {
	if r.deviceIO == nil {
		return nil
	}
	err := r.deviceIO.Close()
	r.deviceIO = nil
	r.deviceIOStagingBytes = 0
	return err
}

// GPUCapacityBytes is the GPU tier's capacity, what placement may put on
// the device: zinf.tiers.gpu_bytes when set; otherwise, on a CUDA device,
// the device's capacity (the memory free on it when it was opened); on the
// simulated device, config.DefaultSimGPUBytes.
func (r *Runtime) GPUCapacityBytes() int64 {
	var deviceBytes int64
	if d, ok := r.device.(*cuda.Device); ok {
		deviceBytes = d.CapacityBytes()
	}
	return r.Config.GPUBytes(deviceBytes)
}

// DeviceIOMode returns r.deviceIO's mode ("gds" or "bounce"), or "off"
// when the config does not select GPUDirect Storage (no DeviceIO).
func (r *Runtime) DeviceIOMode() string {
	if r.deviceIO == nil {
		return gds.ModeOff
	}
	return r.deviceIO.Mode()
}
