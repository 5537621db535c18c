// DSPARK_HOST_DEVICE: a function of a dependency-free header that kernels call as well as host code.
#pragma once

#if defined(__CUDACC__)
#define DSPARK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DSPARK_HOST_DEVICE inline
#endif
