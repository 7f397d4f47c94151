#include <symmpool/testing/fake_driver.hpp>

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

namespace symmpool::testing {

namespace {

struct Handle {
  int fd = -1;
  int device = 0;
  std::size_t size = 0;
  bool released = false;
  int mappings = 0;
};

struct Mapping {
  std::size_t size;
  CUmemGenericAllocationHandle handle;
};

struct Failure {
  int code;
  int count;
  int skip;
};

struct State {
  std::mutex mutex;
  int device_count = 2;
  FakeDeviceConfig config;
  std::vector<std::string> calls;
  std::unordered_map<std::string, Failure> failures;
  std::map<CUmemGenericAllocationHandle, Handle> handles;
  CUmemGenericAllocationHandle next_handle = 1;
  std::map<std::uintptr_t, std::size_t> reservations;
  std::map<std::uintptr_t, Mapping> mappings;
  std::map<std::uintptr_t, bool> events;           // event id -> pending
  std::map<std::uintptr_t, CUstream> recorded_on;  // event id -> stream of its last record
  std::vector<std::pair<CUstream, CUstream>>
      stream_waits;  // (waiting stream, stream the event was recorded on)
  std::uintptr_t next_event = 1;
  bool hold_events = false;
  std::set<CUstream> capturing;  // streams in a graph capture (set_capturing)
  std::function<void()> on_context_synchronize;
  std::set<std::uintptr_t> nccl_registrations;
  std::uintptr_t next_registration = 1;
  std::set<std::uintptr_t> nccl_windows;
  std::function<void()> on_window_register;
  std::vector<std::size_t> used;
};

State& state() {
  static State s;
  return s;
}

thread_local CUcontext current_context = nullptr;
thread_local CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUcontext context_of(int device) { return reinterpret_cast<CUcontext>(std::uintptr_t(device) + 1); }
int device_of(CUcontext ctx) { return static_cast<int>(reinterpret_cast<std::uintptr_t>(ctx)) - 1; }

// Logs the call and returns an injected failure, or 0. Caller holds the lock.
int enter(State& s, const char* name) {
  s.calls.emplace_back(name);
  auto it = s.failures.find(name);
  if (it == s.failures.end()) return 0;
  Failure& f = it->second;
  if (f.skip > 0) {
    --f.skip;
    return 0;
  }
  int code = f.code;
  if (--f.count <= 0) s.failures.erase(it);
  return code;
}

#define FAKE_ENTER(name)                     \
  State& s = state();                        \
  std::lock_guard<std::mutex> lock(s.mutex); \
  if (int injected = enter(s, name)) return static_cast<decltype(CUDA_SUCCESS)>(injected)

bool valid_device(const State& s, int d) { return d >= 0 && d < s.device_count; }

CUresult fake_cuGetErrorString(CUresult code, const char** str) {
  switch (code) {
    case CUDA_SUCCESS:
      *str = "no error";
      break;
    case CUDA_ERROR_INVALID_VALUE:
      *str = "invalid argument";
      break;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *str = "out of memory";
      break;
    case CUDA_ERROR_NOT_READY:
      *str = "device not ready";
      break;
    case CUDA_ERROR_NOT_SUPPORTED:
      *str = "operation not supported";
      break;
    case CUDA_ERROR_NOT_PERMITTED:
      *str = "operation not permitted";
      break;
    default:
      *str = "fake driver error";
      break;
  }
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGet(CUdevice* dev, int ordinal) {
  FAKE_ENTER("cuDeviceGet");
  if (!valid_device(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetCount(int* count) {
  FAKE_ENTER("cuDeviceGetCount");
  *count = s.device_count;
  return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetAttribute(int* value, CUdevice_attribute attr, CUdevice dev) {
  FAKE_ENTER("cuDeviceGetAttribute");
  if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
      *value = 1;
      break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED:
      *value = s.config.fabric_supported;
      break;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
      *value = s.config.multicast_supported;
      break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      *value = static_cast<int>(dev) + 1;
      break;  // one fake GPU per ordinal
    default:
      *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult fake_cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain");
  if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = context_of(dev);
  return CUDA_SUCCESS;
}

CUresult fake_cuDevicePrimaryCtxRelease(CUdevice dev) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease");
  return valid_device(s, dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// Context calls are not logged: they are bookkeeping, not work.
CUresult fake_cuCtxGetCurrent(CUcontext* ctx) {
  *ctx = current_context;
  return CUDA_SUCCESS;
}

CUresult fake_cuCtxSetCurrent(CUcontext ctx) {
  current_context = ctx;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemGetInfo(std::size_t* free_bytes, std::size_t* total) {
  FAKE_ENTER("cuMemGetInfo");
  int d = device_of(current_context);
  if (!valid_device(s, d)) return CUDA_ERROR_INVALID_CONTEXT;
  *total = s.config.total_memory;
  *free_bytes = s.config.total_memory - s.used[d];
  return CUDA_SUCCESS;
}

CUresult fake_cuMemGetAllocationGranularity(std::size_t* g, const CUmemAllocationProp* prop,
                                            CUmemAllocationGranularity_flags) {
  FAKE_ENTER("cuMemGetAllocationGranularity");
  if (!valid_device(s, prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  *g = s.config.granularity;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size,
                          const CUmemAllocationProp* prop, unsigned long long) {
  FAKE_ENTER("cuMemCreate");
  const int d = prop->location.id;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !valid_device(s, d) || size == 0 || size % s.config.granularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) && !s.config.fabric_supported)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (s.used[d] + size > s.config.total_memory) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = memfd_create("symmpool-fake-device-memory", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  s.used[d] += size;
  *handle = s.next_handle++;
  s.handles[*handle] = Handle{fd, d, size, false, 0};
  return CUDA_SUCCESS;
}

// Frees a handle's memory once it is released and unmapped, as the driver does.
void maybe_destroy(State& s, CUmemGenericAllocationHandle h) {
  auto it = s.handles.find(h);
  if (it == s.handles.end() || !it->second.released || it->second.mappings > 0) return;
  close(it->second.fd);
  s.used[it->second.device] -= it->second.size;
  s.handles.erase(it);
}

CUresult fake_cuMemRelease(CUmemGenericAllocationHandle h) {
  FAKE_ENTER("cuMemRelease");
  auto it = s.handles.find(h);
  if (it == s.handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  it->second.released = true;
  maybe_destroy(s, h);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment, CUdeviceptr,
                                  unsigned long long) {
  FAKE_ENTER("cuMemAddressReserve");
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment == 0) alignment = s.config.granularity;
  const std::size_t span = size + alignment;
  void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  auto start = reinterpret_cast<std::uintptr_t>(raw);
  std::uintptr_t aligned = (start + alignment - 1) / alignment * alignment;
  if (aligned > start) munmap(raw, aligned - start);
  if (start + span > aligned + size)
    munmap(reinterpret_cast<void*>(aligned + size), start + span - (aligned + size));
  s.reservations[aligned] = size;
  *ptr = aligned;
  return CUDA_SUCCESS;
}

bool inside_reservation(const State& s, std::uintptr_t p, std::size_t size) {
  auto it = s.reservations.upper_bound(p);
  if (it == s.reservations.begin()) return false;
  --it;
  return p >= it->first && p + size <= it->first + it->second;
}

bool overlaps_mapping(const State& s, std::uintptr_t p, std::size_t size) {
  auto it = s.mappings.lower_bound(p);
  if (it != s.mappings.end() && it->first < p + size) return true;
  if (it == s.mappings.begin()) return false;
  --it;
  return it->first + it->second.size > p;
}

CUresult fake_cuMemAddressFree(CUdeviceptr ptr, std::size_t size) {
  FAKE_ENTER("cuMemAddressFree");
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  if (overlaps_mapping(s, ptr, size)) return CUDA_ERROR_INVALID_VALUE;  // still mapped
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle h,
                       unsigned long long) {
  FAKE_ENTER("cuMemMap");
  auto it = s.handles.find(h);
  if (it == s.handles.end() || it->second.released || offset + size > it->second.size)
    return CUDA_ERROR_INVALID_VALUE;
  if (!inside_reservation(s, ptr, size) || overlaps_mapping(s, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 it->second.fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  ++it->second.mappings;
  s.mappings[ptr] = Mapping{size, h};
  return CUDA_SUCCESS;
}

CUresult fake_cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
  FAKE_ENTER("cuMemUnmap");
  auto it = s.mappings.find(ptr);
  if (it == s.mappings.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
  // Put the hole back as reserved, inaccessible address space.
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
       -1, 0);
  CUmemGenericAllocationHandle h = it->second.handle;
  s.mappings.erase(it);
  --s.handles[h].mappings;
  maybe_destroy(s, h);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemSetAccess(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                             std::size_t count) {
  FAKE_ENTER("cuMemSetAccess");
  auto it = s.mappings.find(ptr);
  if (it == s.mappings.end() || it->second.size != size || count == 0 || !valid_device(s, desc->location.id))
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult fake_cuMemExportToShareableHandle(void* out, CUmemGenericAllocationHandle h,
                                           CUmemAllocationHandleType type, unsigned long long) {
  FAKE_ENTER("cuMemExportToShareableHandle");
  auto it = s.handles.find(h);
  if (it == s.handles.end() || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  *static_cast<int*>(out) = dup(it->second.fd);
  return CUDA_SUCCESS;
}

CUresult fake_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* h, void* shared,
                                             CUmemAllocationHandleType type) {
  FAKE_ENTER("cuMemImportFromShareableHandle");
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(shared));
  struct stat st {};
  if (fstat(fd, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
  // Imported memory is counted against device 0: the fake keeps no owner.
  *h = s.next_handle++;
  s.handles[*h] = Handle{dup(fd), 0, static_cast<std::size_t>(st.st_size), false, 0};
  s.used[0] += static_cast<std::size_t>(st.st_size);
  return CUDA_SUCCESS;
}

CUresult fake_cuMulticastGetGranularity(std::size_t* g, const CUmulticastObjectProp*,
                                        CUmulticastGranularity_flags) {
  FAKE_ENTER("cuMulticastGetGranularity");
  if (!s.config.multicast_supported) return CUDA_ERROR_NOT_SUPPORTED;
  *g = s.config.multicast_granularity;
  return CUDA_SUCCESS;
}

CUresult fake_cuMulticastCreate(CUmemGenericAllocationHandle*, const CUmulticastObjectProp*) {
  FAKE_ENTER("cuMulticastCreate");
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult fake_cuMulticastAddDevice(CUmemGenericAllocationHandle, CUdevice) {
  FAKE_ENTER("cuMulticastAddDevice");
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult fake_cuMulticastBindMem(CUmemGenericAllocationHandle, std::size_t, CUmemGenericAllocationHandle,
                                 std::size_t, std::size_t, unsigned long long) {
  FAKE_ENTER("cuMulticastBindMem");
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult fake_cuMulticastUnbind(CUmemGenericAllocationHandle, CUdevice, std::size_t, std::size_t) {
  FAKE_ENTER("cuMulticastUnbind");
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult fake_cuEventCreate(CUevent* e, unsigned int) {
  FAKE_ENTER("cuEventCreate");
  if (current_context == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::uintptr_t id = s.next_event++;
  s.events[id] = false;
  *e = reinterpret_cast<CUevent>(id);
  return CUDA_SUCCESS;
}

CUresult fake_cuEventRecord(CUevent e, CUstream stream) {
  FAKE_ENTER("cuEventRecord");
  auto it = s.events.find(reinterpret_cast<std::uintptr_t>(e));
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  it->second = s.hold_events;
  s.recorded_on[it->first] = stream;
  return CUDA_SUCCESS;
}

CUresult fake_cuStreamWaitEvent(CUstream stream, CUevent e, unsigned int flags) {
  FAKE_ENTER("cuStreamWaitEvent");
  auto it = s.recorded_on.find(reinterpret_cast<std::uintptr_t>(e));
  if (flags != 0 || it == s.recorded_on.end() || !s.events.count(it->first)) return CUDA_ERROR_INVALID_HANDLE;
  s.stream_waits.emplace_back(stream, it->second);
  return CUDA_SUCCESS;
}

CUresult fake_cuEventQuery(CUevent e) {
  FAKE_ENTER("cuEventQuery");
  // As CUDA: while a stream captures in global mode, a thread that has not
  // relaxed its mode may not make this call (and the capture is invalidated).
  if (!s.capturing.empty() && capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  auto it = s.events.find(reinterpret_cast<std::uintptr_t>(e));
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  return it->second ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult fake_cuEventSynchronize(CUevent e) {
  FAKE_ENTER("cuEventSynchronize");
  auto it = s.events.find(reinterpret_cast<std::uintptr_t>(e));
  if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  it->second = false;  // the "GPU" finishes the work
  return CUDA_SUCCESS;
}

// The "GPU" finishes all its work: every event completes.
CUresult fake_cuCtxSynchronize() {
  std::function<void()> meanwhile;
  {
    FAKE_ENTER("cuCtxSynchronize");
    if (!valid_device(s, device_of(current_context))) return CUDA_ERROR_INVALID_CONTEXT;
    for (auto& [handle, pending] : s.events) pending = false;
    meanwhile = s.on_context_synchronize;
  }
  if (meanwhile) meanwhile();  // outside the fake's lock: it may call the driver
  return CUDA_SUCCESS;
}

CUresult fake_cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  FAKE_ENTER("cuThreadExchangeStreamCaptureMode");
  std::swap(*mode, capture_mode);
  return CUDA_SUCCESS;
}

CUresult fake_cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  FAKE_ENTER("cuStreamIsCapturing");
  *status = s.capturing.count(stream) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult fake_cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus* status, cuuint64_t* id,
                                     CUgraph* graph, const CUgraphNode** dependencies,
                                     const CUgraphEdgeData** edge_data, std::size_t* count) {
  FAKE_ENTER("cuStreamGetCaptureInfo");
  const bool capturing = s.capturing.count(stream) != 0;
  *status = capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = capturing ? 1 : 0;
  if (graph) *graph = nullptr;
  if (dependencies) *dependencies = nullptr;
  if (edge_data) *edge_data = nullptr;
  if (count) *count = 0;
  return CUDA_SUCCESS;
}

// No kernel runs without a GPU: a launch through the fake table is refused.
CUresult fake_cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) {
  FAKE_ENTER("cuLaunchKernel");
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult fake_cuEventDestroy(CUevent e) {
  FAKE_ENTER("cuEventDestroy");
  return s.events.erase(reinterpret_cast<std::uintptr_t>(e)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult fake_cuStreamWriteValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) {
  FAKE_ENTER("cuStreamWriteValue32");
  return CUDA_SUCCESS;
}

CUresult fake_cuStreamWaitValue32(CUstream, CUdeviceptr, cuuint32_t, unsigned int) {
  FAKE_ENTER("cuStreamWaitValue32");
  return CUDA_SUCCESS;
}

// Runs the batch at once, as if the stream were idle: writes store into the
// fake's host-backed "device" memory, in order, so tests can read them; a
// wait must already hold (one fake stream cannot wait for another).
CUresult fake_cuStreamBatchMemOp(CUstream, unsigned int count, CUstreamBatchMemOpParams* ops,
                                 unsigned int flags) {
  FAKE_ENTER("cuStreamBatchMemOp");
  if (count == 0 || count >= 256 || ops == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned int i = 0; i < count; ++i) {
    const CUstreamBatchMemOpParams& op = ops[i];
    if (op.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 &&
        op.writeValue.flags == CU_STREAM_WRITE_VALUE_DEFAULT) {
      *reinterpret_cast<volatile cuuint32_t*>(op.writeValue.address) = op.writeValue.value;
    } else if (op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 &&
               op.waitValue.flags == CU_STREAM_WAIT_VALUE_GEQ) {
      const cuuint32_t now = *reinterpret_cast<const volatile cuuint32_t*>(op.waitValue.address);
      if (static_cast<std::int32_t>(now - op.waitValue.value) < 0) return CUDA_ERROR_ILLEGAL_STATE;
    } else if (op.operation == CU_STREAM_MEM_OP_WRITE_VALUE_64 &&
               op.writeValue.flags == CU_STREAM_WRITE_VALUE_DEFAULT) {
      if (op.writeValue.address % 8 != 0) return CUDA_ERROR_INVALID_VALUE;
      *reinterpret_cast<volatile cuuint64_t*>(op.writeValue.address) = op.writeValue.value64;
    } else if (op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_64 &&
               op.waitValue.flags == CU_STREAM_WAIT_VALUE_GEQ) {
      if (op.waitValue.address % 8 != 0) return CUDA_ERROR_INVALID_VALUE;
      const cuuint64_t now = *reinterpret_cast<const volatile cuuint64_t*>(op.waitValue.address);
      if (static_cast<std::int64_t>(now - op.waitValue.value64) < 0) return CUDA_ERROR_ILLEGAL_STATE;
    } else {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  return CUDA_SUCCESS;
}

DriverApi make_api() {
  DriverApi d;
#define FAKE_SET(name, version) d.name = &fake_##name;
  SYMMPOOL_DRIVER_FUNCTIONS(FAKE_SET)
#undef FAKE_SET
  return d;
}

#define FAKE_NCCL_ENTER(name)                \
  State& s = state();                        \
  std::lock_guard<std::mutex> lock(s.mutex); \
  if (int injected = enter(s, name)) return static_cast<ncclResult_t>(injected)

ncclResult_t fake_ncclCommRegister(const ncclComm_t comm, void* buff, std::size_t size, void** handle) {
  FAKE_NCCL_ENTER("ncclCommRegister");
  if (comm == nullptr || buff == nullptr || size == 0) return ncclInvalidArgument;
  std::uintptr_t id = s.next_registration++;
  s.nccl_registrations.insert(id);
  *handle = reinterpret_cast<void*>(id);
  return ncclSuccess;
}

ncclResult_t fake_ncclCommDeregister(const ncclComm_t comm, void* handle) {
  FAKE_NCCL_ENTER("ncclCommDeregister");
  if (comm == nullptr) return ncclInvalidArgument;
  return s.nccl_registrations.erase(reinterpret_cast<std::uintptr_t>(handle)) ? ncclSuccess
                                                                              : ncclInvalidArgument;
}

// NCCL's window registration is collective and ends in a barrier: the test's
// hook runs where that barrier would wait, outside the fake's lock.
ncclResult_t fake_ncclCommWindowRegister(ncclComm_t comm, void* buff, std::size_t size, ncclWindow_t* win,
                                         int flags) {
  std::function<void()> meanwhile;
  {
    FAKE_NCCL_ENTER("ncclCommWindowRegister");
    if (comm == nullptr || buff == nullptr || size == 0 || flags != NCCL_WIN_COLL_SYMMETRIC)
      return ncclInvalidArgument;
    meanwhile = s.on_window_register;
  }
  if (meanwhile) meanwhile();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::uintptr_t id = s.next_registration++;
  s.nccl_windows.insert(id);
  *win = reinterpret_cast<ncclWindow_t>(id);
  return ncclSuccess;
}

ncclResult_t fake_ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  FAKE_NCCL_ENTER("ncclCommWindowDeregister");
  if (comm == nullptr) return ncclInvalidArgument;
  return s.nccl_windows.erase(reinterpret_cast<std::uintptr_t>(win)) ? ncclSuccess : ncclInvalidArgument;
}

const char* fake_ncclGetErrorString(ncclResult_t code) {
  return code == ncclSuccess ? "no error" : "fake NCCL error";
}

}  // namespace

FakeDriver& FakeDriver::instance() {
  static FakeDriver fake;
  return fake;
}

void FakeDriver::reset(int device_count, FakeDeviceConfig config) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.device_count = device_count;
  s.config = config;
  s.calls.clear();
  s.failures.clear();
  s.hold_events = false;
  s.capturing.clear();
  s.on_context_synchronize = nullptr;
  s.used.assign(static_cast<std::size_t>(device_count), 0);
  // Leftovers from a previous test are dropped, not freed: tests check leaks
  // through the live_* counters before they end.
  s.handles.clear();
  s.mappings.clear();
  s.reservations.clear();
  s.events.clear();
  s.recorded_on.clear();
  s.stream_waits.clear();
  s.nccl_registrations.clear();
  s.nccl_windows.clear();
  s.on_window_register = nullptr;
  current_context = nullptr;
}

const DriverApi& FakeDriver::api() const {
  static const DriverApi api = make_api();
  return api;
}

const NcclApi& FakeDriver::nccl() const {
  static const NcclApi api{&fake_ncclCommRegister,         &fake_ncclCommDeregister,
                           &fake_ncclGetErrorString,       &fake_ncclCommWindowRegister,
                           &fake_ncclCommWindowDeregister, NCCL_VERSION_CODE};
  return api;
}

void FakeDriver::fail(const std::string& function, int code, int count, int skip) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.failures[function] = Failure{code, count, skip};
}

std::vector<std::string> FakeDriver::calls() const {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.calls;
}

std::size_t FakeDriver::count(const std::string& function) const {
  std::size_t n = 0;
  for (const auto& c : calls()) n += (c == function);
  return n;
}

std::size_t FakeDriver::count_prefix(const std::string& prefix) const {
  std::size_t n = 0;
  for (const auto& c : calls()) n += (c.rfind(prefix, 0) == 0);
  return n;
}

void FakeDriver::clear_calls() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.calls.clear();
}

void FakeDriver::hold_events(bool hold) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.hold_events = hold;
}

void FakeDriver::on_context_synchronize(std::function<void()> meanwhile) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.on_context_synchronize = std::move(meanwhile);
}

std::vector<std::pair<CUstream, CUstream>> FakeDriver::stream_waits() const {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stream_waits;
}

void FakeDriver::set_capturing(CUstream stream, bool capturing) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (capturing)
    s.capturing.insert(stream);
  else
    s.capturing.erase(stream);
}

void FakeDriver::abort_nccl_communicators() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.nccl_registrations.clear();
  s.nccl_windows.clear();
}

void FakeDriver::on_window_register(std::function<void()> meanwhile) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.on_window_register = std::move(meanwhile);
}

void FakeDriver::complete_events() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& [id, pending] : s.events) pending = false;
}

std::size_t FakeDriver::used_memory(int device) const {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.used.at(static_cast<std::size_t>(device));
}

#define FAKE_SIZE_OF(member)                 \
  State& s = state();                        \
  std::lock_guard<std::mutex> lock(s.mutex); \
  return s.member.size()

std::size_t FakeDriver::live_handles() const { FAKE_SIZE_OF(handles); }
std::size_t FakeDriver::live_mappings() const { FAKE_SIZE_OF(mappings); }
std::size_t FakeDriver::live_reservations() const { FAKE_SIZE_OF(reservations); }
std::size_t FakeDriver::live_events() const { FAKE_SIZE_OF(events); }
std::size_t FakeDriver::live_nccl_registrations() const { FAKE_SIZE_OF(nccl_registrations); }
std::size_t FakeDriver::live_nccl_windows() const { FAKE_SIZE_OF(nccl_windows); }

}  // namespace symmpool::testing
