/* probe.cu — the CUDA backend's first translation unit: proves that nvcc and cudart build and link
 * into libtern. tern_cuda_device_count() reports the visible devices (0 when none or no driver). */
#include <cuda_runtime.h>

extern "C" int tern_cuda_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess)
		return 0;
	return n;
}
