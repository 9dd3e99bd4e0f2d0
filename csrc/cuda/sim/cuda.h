/* cuda.h (simulator): the stand-in for the part of CUDA's driver API <cuda.h>
 * that the backend uses: the virtual memory calls behind expandable segments
 * (reserve an address range, create physical chunks, map and unmap them,
 * set their access), with CUDA's names, types and enum values. The backend
 * loads the real ones from libcuda at run time (cuda_census.cu); a
 * NEEDLE_CUDA=sim build points the same table at these, which sim_vm.cc
 * implements against the simulated GPU's memory, so CI runs the expandable
 * segments' code without a GPU.
 */
#ifndef NEEDLE_SIM_CUDA_H
#define NEEDLE_SIM_CUDA_H

#include <stddef.h>

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
} CUresult;

typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef enum CUmemAllocationType_enum { CU_MEM_ALLOCATION_TYPE_PINNED = 0x1 } CUmemAllocationType;
typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0x0
} CUmemAllocationHandleType;
typedef enum CUmemLocationType_enum { CU_MEM_LOCATION_TYPE_DEVICE = 0x1 } CUmemLocationType;
typedef enum CUmemAccess_flags_enum { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3 } CUmemAccess_flags;
typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1
} CUmemAllocationGranularity_flags;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

extern "C" {
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuGetErrorName(CUresult error, const char **name);
}

#endif /* NEEDLE_SIM_CUDA_H */
