package zinf

// ForgetBandwidths empties the process's memory of NVMe bandwidths, so a
// test sees a probe or a cache file rather than an earlier test's figure.
var ForgetBandwidths = forgetBandwidths
