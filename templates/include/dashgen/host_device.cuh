// dashgen/host_device.cuh: DASHGEN_HD, the qualifier of the functions that compile both in the
// kernels (NVRTC) and as host C++ (the tests that compile the schedule, mask and pack headers
// with g++ and check them against the Python IR).
#ifndef DASHGEN_HOST_DEVICE_CUH
#define DASHGEN_HOST_DEVICE_CUH

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define DASHGEN_HD __host__ __device__ __forceinline__
#else
#define DASHGEN_HD inline
#endif

#endif  // DASHGEN_HOST_DEVICE_CUH
