// The sim's C++ runtime: what PyTorch's C++ side asks of an accelerator on PrivateUse1 and a
// Python backend cannot answer (torch's Python-registered device guard answers only the device
// type: device 0, one device, no events). Registered by flagos_torchfl.sim.native, which builds
// this file with the machine's C++ compiler at first use and calls the C functions at the end
// through ctypes. Work on the sim runs inline in the calling thread, so every stream is idle,
// every wait returns at once and an event is the host time at which it was recorded.
//
// What it registers:
//  * a device guard: a current device per thread, N devices, a current stream per thread and
//    device (stream 0 is the default one; a pool of 32 streams per priority per device, handed out
//    round robin as CUDA's pool is), timed events, device capabilities;
//  * PrivateUse1 hooks: availability, device count and current device, a pinned host allocator
//    (DDP's reducer with find_unused_parameters, Tensor.pin_memory, DataLoader pin_memory) that
//    knows every address inside its blocks (is_pinned of a view into pinned memory);
//  * profiler stubs, so the profiler's device-side events of PrivateUse1 have host timestamps;
//  * a DDP timer (DDP's logger measures forward, backward and communication per device type);
//  * the device's memory (a c10::DeviceAllocator whose blocks come from each device's caching
//    allocator, allocator.h, with its statistics and the profiler's memory reports) and pinned
//    host memory (an at::HostAllocator: torch.accelerator.empty_host_cache);
//  * the boxed kernel of the sim's native operators (below: "The C++ route");
//  * the choice of scaled_dot_product_attention's fused kernel, where the native set has the
//    host's (fl_sim_set_fused_attention).
#include <Python.h>

#include "allocator.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/library.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/profiler/stubs/base.h>

#if __has_include(<torch/csrc/distributed/c10d/reducer_timer.hpp>)
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#define FL_SIM_HAS_DDP_TIMER 1
#endif

#if __has_include(<ATen/core/GraphImplInterface.h>)
#include <ATen/core/GraphImplInterface.h>
#define FL_SIM_HAS_GRAPH_IMPL 1
#endif
#if __has_include(<c10/core/DeviceCapability.h>)
#include <c10/core/DeviceCapability.h>
#define FL_SIM_HAS_CAPABILITY 1
#endif

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <string>
#include <vector>

namespace flsim {

constexpr int kMaxDevices = 64;
constexpr int kPoolSize = 32;  // streams per priority per device
constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
constexpr c10::DispatchKey kKey = c10::DispatchKey::PrivateUse1;

std::atomic<int> g_devices{0};
std::atomic<bool> g_bfloat16{true};
// The dtypes a device holds, as bits of c10::DeviceCapability: asked of g_py_dtypes() (names as
// c10 spells them, fl_sim_set_dtypes) at the first capability question, then kept.
PyObject* g_py_dtypes = nullptr;
std::atomic<bool> g_dtypes_known{false};
std::atomic<uint64_t> g_dtype_bits{~0ULL};
uint64_t dtype_bits();
std::atomic<bool> g_used{false};
thread_local int t_device = 0;
thread_local c10::StreamId t_streams[kMaxDevices] = {};
std::atomic<uint32_t> g_pool_next[kMaxDevices][2] = {};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string name() {
  return c10::get_privateuse1_backend();
}

int check_index(int index) {
  const int n = g_devices.load();
  TORCH_CHECK(index >= 0 && index < n, "invalid ", name(), " device index ", index, ": ", n,
              " ", name(), " device(s) are installed");
  return index;
}

int resolve(c10::DeviceIndex index) {
  return index < 0 ? t_device : check_index(index);
}

c10::Stream stream_on(int device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, static_cast<c10::DeviceIndex>(device)), id);
}

c10::StreamId pool_stream(int device, bool high_priority) {
  const uint32_t k = g_pool_next[device][high_priority ? 1 : 0].fetch_add(1) % kPoolSize;
  return 1 + (high_priority ? kPoolSize : 0) + static_cast<c10::StreamId>(k);
}

struct Event {
  int device;
  bool timing;
  int64_t ns;
};

struct Guard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected a ", name(), " device, got ", d);
    const int previous = t_device;
    t_device = resolve(d.index());
    return c10::Device(kType, static_cast<c10::DeviceIndex>(previous));
  }

  c10::Device getDevice() const override {
    return c10::Device(kType, static_cast<c10::DeviceIndex>(t_device));
  }

  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected a ", name(), " device, got ", d);
    t_device = resolve(d.index());
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < g_devices.load()) t_device = d.index();
  }

  c10::Stream getStream(c10::Device d) const override {
    const int device = resolve(d.index());
    return stream_on(device, t_streams[device]);
  }

  c10::Stream getDefaultStream(c10::Device d) const override {
    return stream_on(resolve(d.index()), 0);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority = false) const override {
    const int device = resolve(d.index());
    return stream_on(device, pool_stream(device, isHighPriority));
  }

  c10::Stream getNewStream(c10::Device d, int priority = 0) const override {
    const int device = resolve(d.index());
    return stream_on(device, pool_stream(device, priority < 0));
  }

  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const int device = s.device_index() < 0 ? t_device : s.device_index();
    if (device >= g_devices.load()) return s;
    const c10::StreamId previous = t_streams[device];
    t_streams[device] = s.id();
    return stream_on(device, previous);
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_devices.load());
  }

#ifdef FL_SIM_HAS_CAPABILITY
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    resolve(d.index());
    c10::DeviceCapability capability;
    capability.capability_data.capability_bits &= dtype_bits();
    if (!g_bfloat16.load()) capability.capability_data.supported_scalar_types.has_BFloat16 = 0;
    return capability;
  }
#endif

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                device_index, " does not match recording stream's device index ",
                stream.device_index(), ".");
    auto* e = static_cast<Event*>(*event);
    if (e == nullptr) {
      e = new Event{stream.device_index(), flag == c10::EventFlag::BACKEND_DEFAULT, 0};
      *event = e;
    }
    e->device = stream.device_index();
    e->ns = now_ns();
  }

  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}

  bool queryEvent(void* /*event*/) const override { return true; }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }

  void synchronizeEvent(void* /*event*/) const override {}

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before calculating elapsed time.");
    const auto* a = static_cast<Event*>(start);
    const auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a->timing && b->timing,
                "Both events must be created with argument 'enable_timing=True'.");
    return static_cast<double>(b->ns - a->ns) / 1e6;
  }

  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }

  void synchronizeStream(const c10::Stream& /*stream*/) const override {}

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    if (device_index >= 0) check_index(device_index);
  }

  void recordDataPtrOnStream(const c10::DataPtr& /*data*/, const c10::Stream& /*stream*/) const override {}
};

// Pinned host memory: ordinary host memory (the sim's transfers are host copies) whose blocks are
// remembered, so that any address inside one is known to be pinned.
struct PinnedAllocator final : public at::HostAllocator {
  mutable std::mutex lock;
  mutable std::map<uintptr_t, size_t> blocks;

  static void release(void* ptr);

  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      ptr = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
      TORCH_CHECK(ptr != nullptr, "pinned host allocation of ", nbytes, " bytes failed");
      std::lock_guard<std::mutex> hold(lock);
      blocks[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
    }
    return {ptr, ptr, &PinnedAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &PinnedAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  // Sim work runs inline: no event to wait for, nothing cached to give back.
  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}

  bool contains(const void* data) const {
    const auto address = reinterpret_cast<uintptr_t>(data);
    std::lock_guard<std::mutex> hold(lock);
    auto it = blocks.upper_bound(address);
    if (it == blocks.begin()) return false;
    --it;
    return address < it->first + (it->second == 0 ? 1 : it->second);
  }
};

PinnedAllocator g_pinned;

void PinnedAllocator::release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> hold(g_pinned.lock);
    g_pinned.blocks.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  std::free(ptr);
}

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_devices.load() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return g_used.load() && device_index >= 0 && device_index < g_devices.load();
  }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(g_devices.load()); }
  void setCurrentDevice(c10::DeviceIndex device) const override { t_device = check_index(device); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(t_device); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const int previous = t_device;
    t_device = check_index(device);
    return static_cast<c10::DeviceIndex>(previous);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    if (device < 0 || device >= g_devices.load()) return static_cast<c10::DeviceIndex>(t_device);
    return exchangeDevice(device);
  }
  bool isPinnedPtr(const void* data) const override { return g_pinned.contains(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned; }
};

struct ProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (device) *device = static_cast<c10::DeviceIndex>(t_device);
    const int64_t now = now_ns();
    if (event) *event = std::make_shared<int64_t>(now);
    if (cpu_ns) *cpu_ns = now;
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    const auto a = *static_cast<const int64_t*>(start->get());
    const auto b = *static_cast<const int64_t*>(end->get());
    return static_cast<float>(b - a) / 1e3f;  // microseconds, as CUDA's stubs answer
  }
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    const int previous = t_device;
    for (int i = 0; i < g_devices.load(); ++i) {
      t_device = i;
      op(i);
    }
    t_device = previous;
  }
  void synchronize() const override {}
};

#ifdef FL_SIM_HAS_DDP_TIMER
// DDP's timer of an inline device: host timestamps, as the CPU's timer.
struct DdpTimer final : public c10d::Timer {
  explicit DdpTimer(c10::Device /*device*/) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const int64_t a = getTimeRef(start);
    const int64_t b = getTimeRef(end);
    if (a == c10d::kUnsetTime || b == c10d::kUnsetTime) return std::nullopt;
    return b - a;
  }
};

void register_ddp_timer() {
  auto* registry = c10d::TimerRegistry();
  if (!registry->Has(kType)) {
    registry->Register(kType, [](c10::Device device) -> std::unique_ptr<c10d::Timer> {
      return std::make_unique<DdpTimer>(device);
    });
  }
}
#else
void register_ddp_timer() {}
#endif

// ---- Device memory ---------------------------------------------------------------------------
// Blocks come from the device's caching allocator (allocator.h: its policy, limits, statistics
// and the profiler's memory reports), which Python made (flagos_torchfl/sim/runtime/cpp/
// allocator.py) and handed over with fl_sim_install_memory.
CachingAllocator* g_allocators[kMaxDevices] = {};
std::atomic<bool> g_bad_fork{false};
thread_local int t_alloc_device = -1;  // >= 0: CPU allocations of this thread are sim memory

// Sets where the calling thread's CPU allocations go (-1: the host) for its lifetime; Python code
// that a kernel calls allocates on the host.
struct AllocateOn {
  int previous;
  explicit AllocateOn(int device) : previous(t_alloc_device) { t_alloc_device = device; }
  ~AllocateOn() { t_alloc_device = previous; }
};

// The pending Python exception's message (taken off); it starts with \x01 for an out-of-memory error.
std::string python_error() {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  std::string message = "unknown error";
  if (value != nullptr) {
    PyObject* text = PyObject_Str(value);
    if (text != nullptr) {
      const char* utf8 = PyUnicode_AsUTF8(text);
      if (utf8 != nullptr) message = utf8;
      Py_DECREF(text);
    }
  }
  const bool oom = type != nullptr && PyType_Check(type) &&
                   std::string(reinterpret_cast<PyTypeObject*>(type)->tp_name).find("OutOfMemoryError") !=
                       std::string::npos;
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  return (oom ? "\x01" : "") + message;
}

// A DataPtr's context is its address (what raw_allocate, which some CPU kernels use, requires):
// the device allocator that handed the block out knows it by that address.
c10::Allocator* g_host_allocator = nullptr;  // the CPU allocator g_cpu_allocator replaced

void sim_delete(void* ptr) {
  if (ptr == nullptr) return;
  const int n = g_devices.load();
  for (int i = 0; i < n; ++i) {
    if (g_allocators[i] != nullptr && g_allocators[i]->release(ptr)) return;
  }
  g_host_allocator->raw_deleter()(ptr);  // host memory handed out through raw_allocate
}

// In a child forked after the devices were used, every use fails as an accelerator's does.
void check_fork() {
  if (!g_bad_fork.load()) return;
  std::string kind = name();
  for (auto& c : kind) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  TORCH_CHECK(false, "Cannot re-initialize ", kind, " in forked subprocess. To use ", kind,
              " with multiprocessing, you must use the 'spawn' start method");
}

// Python's note of the devices' first use (fl_sim_set_first_use), called once when the runtime
// uses them first (an allocation) rather than Python.
PyObject* g_py_first_use = nullptr;

void note_use() {
  if (g_used.load(std::memory_order_relaxed) || g_used.exchange(true)) return;
  if (g_py_first_use == nullptr || !Py_IsInitialized() || _Py_IsFinalizing()) return;
  AllocateOn host(-1);
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyObject* done = PyObject_CallNoArgs(g_py_first_use);
  if (done == nullptr) PyErr_WriteUnraisable(g_py_first_use);
  Py_XDECREF(done);
  PyErr_Restore(type, value, trace);
  PyGILState_Release(gil);
}

// `nbytes` of sim memory of device `device`, as a DataPtr that says `on`.
c10::DataPtr sim_block(int device, size_t nbytes, c10::Device on) {
  check_fork();
  note_use();
  void* ptr = g_allocators[device]->allocate(nbytes);
  return {ptr, ptr, &sim_delete, on};
}

// A new block as sim_block makes one, holding the `keep` bytes at `from` first.
c10::DataPtr sim_block_holding(int device, size_t nbytes, c10::Device on, const void* from, size_t keep) {
  c10::DataPtr data = sim_block(device, nbytes, on);
  if (keep) std::memcpy(data.get(), from, keep);
  return data;
}

// The allocators `device` names: that device's, or every device's for -1.
std::vector<CachingAllocator*> allocators_of(int device) {
  std::vector<CachingAllocator*> chosen;
  const int n = g_devices.load();
  for (int i = 0; i < n; ++i) {
    if ((device < 0 || device == i) && g_allocators[i] != nullptr) chosen.push_back(g_allocators[i]);
  }
  return chosen;
}

struct SimAllocator final : public c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const int device = t_alloc_device >= 0 ? t_alloc_device : t_device;
    return sim_block(device, nbytes, c10::Device(kType, static_cast<c10::DeviceIndex>(device)));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &sim_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool initialized() override { return g_used.load(); }
  void emptyCache(c10::MempoolId_t /*pool*/) override {
    for (CachingAllocator* a : allocators_of(-1)) a->empty_cache();
  }
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    int64_t values[CachingAllocator::kStatValues];
    g_allocators[resolve(device)]->stats(values);
    c10::CachingDeviceAllocator::DeviceStats stats;
    auto fill = [&](c10::CachingDeviceAllocator::StatArray& array, StatName kind) {
      for (int g = 0; g < kGroups; ++g) {
        const int64_t* v = values + (kind * kGroups + g) * 4;
        array[g].current = v[0];
        array[g].peak = v[1];
        array[g].allocated = v[2];
        array[g].freed = v[3];
      }
    };
    fill(stats.allocation, kAllocation);
    fill(stats.segment, kSegment);
    fill(stats.active, kAllocation);
    fill(stats.allocated_bytes, kAllocatedBytes);
    fill(stats.reserved_bytes, kReservedBytes);
    fill(stats.active_bytes, kAllocatedBytes);
    fill(stats.requested_bytes, kRequestedBytes);
    stats.num_alloc_retries = values[CachingAllocator::kStatValues - 2];
    stats.num_ooms = values[CachingAllocator::kStatValues - 1];
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    for (CachingAllocator* a : allocators_of(device)) a->reset_accumulated();
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    for (CachingAllocator* a : allocators_of(device)) a->reset_peak();
  }
};

// Allocations a CPU kernel makes of at most this many bytes (one element of the widest dtype)
// are host memory: mostly temporaries, such as a Python number cast to the operands' dtype by
// TensorIterator; an output among them is copied to the device (Call::tensor_to_sim, adopt).
constexpr size_t kHostBytes = 16;

// The CPU allocator while a sim kernel runs its CPU kernel: what the CPU kernel allocates on the
// calling thread (its outputs) is sim memory of the kernel's device, so an output becomes a sim
// tensor without a copy; an allocation of at most kHostBytes is host memory. Everywhere else it
// is the CPU allocator it replaced.
struct CpuAllocator final : public c10::Allocator {
  c10::Allocator* host = nullptr;
  c10::DataPtr allocate(size_t nbytes) override {
    if (t_alloc_device < 0 || nbytes <= kHostBytes) return host->allocate(nbytes);
    return sim_block(t_alloc_device, nbytes, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &sim_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

SimAllocator g_sim_allocator;
CpuAllocator g_cpu_allocator;

// ---- The C++ route ------------------------------------------------------------------------
// One boxed kernel per native operator: host views (CPU tensors over the sim tensors' memory)
// replace the sim tensors on the stack, the operator's CPU kernel runs on them, and its results
// become sim tensors: an output over an input's memory is a sim tensor on that input's storage
// (a view), an output the CPU kernel allocated is already sim memory (g_cpu_allocator) and its
// storage is handed to the device; in-place and out= results are the very tensors given.
void delete_storage_ref(void* context) { delete static_cast<c10::Storage*>(context); }

c10::Storage host_storage_of(const c10::Storage& sim) {
  c10::StorageImpl* impl = sim.unsafeGetStorageImpl();
  void* ptr = const_cast<void*>(impl->data());
  c10::DataPtr data(ptr, new c10::Storage(sim), &delete_storage_ref, c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                            impl->nbytes(), std::move(data),
                                                            &g_cpu_allocator, true));
}

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return at::Tensor(std::move(impl));
}

// A view over `storage` with `keys` (its base's), as the CPU's view kernels make one: a view of a
// tensor made outside inference mode is no inference tensor, also when made inside it (autograd
// gives it its base's version counter), and a view of an inference tensor is one.
at::Tensor view_on(c10::Storage storage, c10::DispatchKeySet keys, const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, std::move(storage), keys, like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return at::Tensor(std::move(impl));
}

std::string device_text(int index) { return name() + ":" + std::to_string(index); }

struct Signature {
  std::string name;
  size_t arguments = 0;
  std::vector<int> written;      // arguments the operator writes
  std::vector<int> return_of;    // per return: the argument it is (-1: a new value)
  bool cpu_indices_ok = false;   // accepts CPU index tensors beside device tensors
  int pin_memory = -1, non_blocking = -1;  // _to_copy's: a non-blocking copy to the host is pinned
};

struct Call {
  const Signature& sig;
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> host_of;  // sim storage -> host storage
  std::vector<c10::DispatchKeySet> keys_of;                          // per host_of: its tensor's keys
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> fresh;    // host storage -> sim storage
  // sim tensor -> its host view: a tensor passed twice (an input and its ``out=``) is one tensor
  // to the CPU kernel too, whose overlap checks tell the same tensor from another view
  std::vector<std::pair<c10::TensorImpl*, at::Tensor>> views;
  int first = -1, second = -1, target = -1;
  bool keep_cpu = false, foreign = false, foreign_written = false;
  std::string foreign_device;

  explicit Call(const Signature& s) : sig(s) {}

  at::Tensor host_view(const at::Tensor& t) {
    TORCH_CHECK(t.layout() == c10::kStrided, name(), " supports strided tensors only, got ",
                t.layout(), " in ", sig.name);
    const int index = t.device().index();
    if (first < 0) first = index;
    else if (index != first && second < 0) second = index;
    for (auto& [impl, view] : views)
      if (impl == t.unsafeGetTensorImpl()) return view;
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    c10::Storage host;
    for (auto& [sim, known] : host_of)
      if (sim == key) host = known;
    if (!host) {
      host = host_storage_of(t.storage());
      host_of.emplace_back(key, host);
      keys_of.push_back(t.key_set());
    }
    at::Tensor view = tensor_on(host, c10::DispatchKey::CPU, t);
    views.emplace_back(t.unsafeGetTensorImpl(), view);
    return view;
  }

  c10::IValue to_host(const c10::IValue& value, bool written) {
    if (value.isTensor()) {
      const at::Tensor& t = value.toTensor();
      if (!t.defined()) return value;
      if (t.device().type() == kType) return host_view(t);
      if (t.dim() != 0 || written) {
        if (!foreign) foreign_device = c10::str(t.device());
        foreign = true;
        foreign_written = foreign_written || written;
      }
      return value;
    }
    if (value.isList()) {
      auto list = value.toList();
      bool any = false;
      for (const c10::IValue& e : list) {
        if (e.isTensor() && e.toTensor().defined()) { any = true; break; }
      }
      if (!any) return value;
      c10::impl::GenericList out(list.elementType());
      out.reserve(list.size());
      for (const c10::IValue& e : list) out.push_back(to_host(e, written));
      return out;
    }
    if (value.isDevice()) {
      const c10::Device d = value.toDevice();
      if (d.type() == kType) {
        target = d.has_index() ? check_index(d.index()) : t_device;
        return c10::Device(c10::DeviceType::CPU);
      }
      keep_cpu = true;
    }
    return value;
  }

  void check_devices() const {
    TORCH_CHECK(second < 0, "Expected all tensors to be on the same device, but found at least two devices, ",
                device_text(first), " and ", device_text(second), "! (in ", sig.name, ")");
    TORCH_CHECK(first < 0 || !foreign || (sig.cpu_indices_ok && !foreign_written),
                "Expected all tensors to be on the same device, but found at least two devices, ",
                device_text(first), " and ", foreign_device, "! (in ", sig.name, ")");
  }

  int output_device() const { return target >= 0 ? target : (first >= 0 ? first : t_device); }

  c10::IValue to_sim(const c10::IValue& value) {
    if (value.isTensor()) return tensor_to_sim(value.toTensor());
    if (value.isList()) {
      auto list = value.toList();
      c10::impl::GenericList out(list.elementType());
      out.reserve(list.size());
      for (const c10::IValue& e : list) out.push_back(to_sim(e));
      return out;
    }
    return value;
  }

  at::Tensor tensor_to_sim(const at::Tensor& v) {
    if (!v.defined() || v.device().type() != c10::DeviceType::CPU) return v;
    if (v.layout() != c10::kStrided || v.is_quantized()) {  // a sparse or quantized result
      // (`_to_sparse` of a dense operand): moved whole, its copy served by the device's kernels
      // for that kind of tensor, or refused with the dispatcher's words where it has none
      return keep_cpu ? v : v.to(c10::Device(kType, static_cast<c10::DeviceIndex>(output_device())));
    }
    c10::StorageImpl* key = v.storage().unsafeGetStorageImpl();
    for (size_t i = 0; i < host_of.size(); ++i) {
      auto& [sim, host] = host_of[i];
      if (host.unsafeGetStorageImpl() == key) {
        if (keep_cpu) return v.clone();
        c10::Storage storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(sim));
        return view_on(storage, keys_of[i], v);
      }
    }
    if (keep_cpu) return v;
    for (auto& [host, sim] : fresh)
      if (host == key) return tensor_on(sim, kKey, v);
    const int device = output_device();
    const c10::Device on(kType, static_cast<c10::DeviceIndex>(device));
    c10::Storage sim;
    if (key->data_ptr().get_deleter() == &sim_delete && key->data_ptr().device().is_cpu()) {
      key->mutable_data_ptr().unsafe_set_device(on);  // sim memory the CPU kernel allocated
      key->set_resizable(false);
      sim = v.storage();
    } else {  // host memory (a kernel's own): copied to the device
      const size_t nbytes = key->nbytes();
      c10::DataPtr data = sim_block_holding(device, nbytes, on, key->data(), nbytes);
      sim = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), &g_sim_allocator, false));
    }
    fresh.emplace_back(key, sim);
    return tensor_on(sim, kKey, v);
  }

  // Make written sim tensor `sim` show `host` (its host view after the CPU kernel ran).
  void adopt(const at::Tensor& sim, const at::Tensor& host) {
    c10::StorageImpl* sim_storage = sim.storage().unsafeGetStorageImpl();
    c10::StorageImpl* host_storage = host.storage().unsafeGetStorageImpl();
    c10::Storage mine;
    for (auto& [s, h] : host_of)
      if (s == sim_storage) mine = h;
    if (mine.unsafeGetStorageImpl() == host_storage) {
      if (host_storage->data() != sim_storage->data() || host_storage->nbytes() != sim_storage->nbytes()) {
        // the CPU kernel grew the output: its new memory is sim memory (g_cpu_allocator), or
        // host memory up to kHostBytes, copied to the device
        c10::DataPtr grown = host_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
        const size_t nbytes = host_storage->nbytes();
        if (grown.get_deleter() != &sim_delete) {
          grown = sim_block_holding(sim.device().index(), nbytes, sim.device(), grown.get(), nbytes);
        }
        grown.unsafe_set_device(sim.device());
        sim_storage->set_data_ptr_noswap(std::move(grown));
        sim_storage->set_nbytes(nbytes);
      }
    } else {  // the kernel pointed the output elsewhere: copy what it holds
      at::Tensor source = host;
      const int64_t need = at::detail::computeStorageNbytes(host.sizes(), host.strides(),
                                                            host.dtype().itemsize(),
                                                            sim.storage_offset());
      if (static_cast<size_t>(need) > sim_storage->nbytes()) {
        sim_storage->set_data_ptr_noswap(sim_block_holding(sim.device().index(), need, sim.device(),
                                                           sim_storage->data(), sim_storage->nbytes()));
        sim_storage->set_nbytes(need);
      }
      sim.unsafeGetTensorImpl()->set_sizes_and_strides(host.sizes(), host.strides(), sim.storage_offset());
      // a view of the storage as it is now (the call's views may show the block it had)
      tensor_on(host_storage_of(sim.storage()), c10::DispatchKey::CPU, sim).copy_(source);
      return;
    }
    if (sim.sizes() != host.sizes() || sim.strides() != host.strides() ||
        sim.storage_offset() != host.storage_offset()) {
      sim.unsafeGetTensorImpl()->set_sizes_and_strides(host.sizes(), host.strides(), host.storage_offset());
    }
  }

  void sync(const c10::IValue& original, const c10::IValue& passed) {
    if (original.isTensor()) {
      const at::Tensor& t = original.toTensor();
      if (t.defined() && t.device().type() == kType) adopt(t, passed.toTensor());
    } else if (original.isList() && passed.isList()) {
      auto a = original.toList();
      auto b = passed.toList();
      for (size_t i = 0; i < a.size() && i < b.size(); ++i) sync(a.get(i), b.get(i));
    }
  }
};

// The census of native calls (fl_sim_count_calls): each kernel counts its calls and their host
// time while counting is on, except on a thread the router has paused (a call made inside a route
// is the route's work).
std::atomic<bool> g_count{false};
thread_local bool t_count_paused = false;
struct SimKernel;
std::mutex g_kernels_lock;
std::vector<SimKernel*> g_kernels;  // every C++ route kernel (the dispatcher owns them)

struct SimKernel final : public c10::OperatorKernel {
  Signature sig;
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> ns{0};
  explicit SimKernel(Signature s) : sig(std::move(s)) {
    std::lock_guard<std::mutex> hold(g_kernels_lock);
    g_kernels.push_back(this);
  }
  ~SimKernel() override {
    std::lock_guard<std::mutex> hold(g_kernels_lock);
    g_kernels.erase(std::remove(g_kernels.begin(), g_kernels.end(), this), g_kernels.end());
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
    check_fork();
    const bool counted = g_count.load(std::memory_order_relaxed) && !t_count_paused;
    const int64_t start = counted ? now_ns() : 0;
    run(op, stack);
    if (counted) {
      calls.fetch_add(1, std::memory_order_relaxed);
      ns.fetch_add(now_ns() - start, std::memory_order_relaxed);
    }
  }

  void run(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    auto& s = *stack;
    const size_t base = s.size() - sig.arguments;
    std::vector<c10::IValue> original(s.begin() + base, s.end());
    Call call(sig);
    for (size_t i = 0; i < sig.arguments; ++i) {
      const bool written = std::find(sig.written.begin(), sig.written.end(), static_cast<int>(i)) != sig.written.end();
      s[base + i] = call.to_host(original[i], written);
    }
    call.check_devices();
    // A non-blocking copy from the device to the host lands in pinned memory, as an
    // accelerator's does (the CPU kernel pins only copies from a device it runs on).
    const bool pin = call.keep_cpu && sig.pin_memory >= 0 && call.first >= 0 &&
                     s[base + sig.non_blocking].isBool() && s[base + sig.non_blocking].toBool() &&
                     s[base + sig.pin_memory].isNone();
    std::vector<c10::IValue> passed;
    passed.reserve(sig.written.size());
    for (int w : sig.written) passed.push_back(s[base + w]);
    {
      AllocateOn allocate(call.keep_cpu ? -1 : call.output_device());
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    }
    for (size_t i = 0; i < sig.written.size(); ++i) call.sync(original[sig.written[i]], passed[i]);
    const size_t returns = sig.return_of.size();
    const size_t first_return = s.size() - returns;
    for (size_t j = 0; j < returns; ++j) {
      const int writer = sig.return_of[j];
      s[first_return + j] = writer >= 0 ? original[writer] : call.to_sim(s[first_return + j]);
    }
    if (pin && returns == 1 && s.back().isTensor()) s.back() = s.back().toTensor().pin_memory();
  }
};

Signature signature_of(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  Signature sig;
  sig.name = c10::toString(schema.operator_name());
  sig.arguments = schema.arguments().size();
  std::map<c10::Symbol, int> writers;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& a = schema.arguments()[i];
    if (a.alias_info() && a.alias_info()->isWrite()) {
      for (const auto& set : a.alias_info()->beforeSets()) writers[set] = static_cast<int>(i);
      sig.written.push_back(static_cast<int>(i));
    }
    if (sig.name == "aten::_to_copy" && a.name() == "pin_memory") sig.pin_memory = static_cast<int>(i);
    if (sig.name == "aten::_to_copy" && a.name() == "non_blocking") sig.non_blocking = static_cast<int>(i);
  }
  for (const auto& r : schema.returns()) {
    int writer = -1;
    if (r.alias_info() && r.alias_info()->isWrite()) {
      for (const auto& set : r.alias_info()->beforeSets()) {
        auto it = writers.find(set);
        if (it != writers.end()) writer = it->second;
      }
    }
    sig.return_of.push_back(writer);
  }
  static const char* cpu_indices[] = {"aten::index.Tensor", "aten::index.Tensor_out", "aten::index_put",
                                      "aten::index_put_", "aten::index_put.out", "aten::_index_put_impl_",
                                      "aten::_index_put_impl", "aten::_index_put_impl.out"};
  for (const char* n : cpu_indices) sig.cpu_indices_ok = sig.cpu_indices_ok || sig.name == n;
  return sig;
}

// Kernels of the runtime itself: allocation and copies.
int resolve_target(std::optional<c10::Device> device) {
  if (!device.has_value() || !device->has_index()) return t_device;
  return check_index(device->index());
}

void check_factory(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::kStrided, name(), " supports strided tensors only, not ",
              *layout);
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
}

at::Tensor sim_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                     std::optional<c10::Device> device, std::optional<bool> pin_memory,
                     std::optional<c10::MemoryFormat> memory_format) {
  check_fork();
  check_factory(layout, pin_memory);
  AllocateOn allocate(resolve_target(device));
  return at::detail::empty_generic(size, &g_sim_allocator, c10::DispatchKeySet(kKey),
                                   dtype.value_or(c10::get_default_dtype_as_scalartype()), memory_format);
}

at::Tensor sim_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                             std::optional<bool> pin_memory) {
  check_fork();
  check_factory(layout, pin_memory);
  AllocateOn allocate(resolve_target(device));
  return at::detail::empty_strided_generic(size, stride, &g_sim_allocator, c10::DispatchKeySet(kKey),
                                           dtype.value_or(c10::get_default_dtype_as_scalartype()));
}

at::Tensor on_host(const at::Tensor& t, const char* role) {
  if (t.device().type() == c10::DeviceType::CPU) return t;
  TORCH_CHECK(t.device().type() == kType, name(), " cannot copy ", role, " ", t.device());
  return tensor_on(host_storage_of(t.storage()), c10::DispatchKey::CPU, t);
}

at::Tensor& sim_copy_(at::Tensor& self, const at::Tensor& src, bool /*non_blocking*/) {
  check_fork();
  at::Tensor destination = on_host(self, "to");
  // within one sim storage, both views on one host storage: the CPU copy's overlap checks see it
  const bool shared = self.device().type() == kType && src.device().type() == kType &&
                      self.storage().is_alias_of(src.storage());
  destination.copy_(shared ? tensor_on(destination.storage(), c10::DispatchKey::CPU, src) : on_host(src, "from"));
  return self;
}

at::Tensor sim_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor out = dst;
  sim_copy_(out, self, non_blocking);
  return dst;
}

// ---- Graphs ----------------------------------------------------------------------------------
// torch.accelerator.Graph's implementation for the device (at::GraphImplInterface, registered
// under the device type's name): each graph is one of the sim's Python graphs (the engine of
// sim/runtime/graphs.py), made by g_py_graph(keep_graph); every call is that graph's method.
PyObject* g_py_graph = nullptr;

#ifdef FL_SIM_HAS_GRAPH_IMPL
// Raises the pending Python exception as a C++ one: an accelerator error stays one.
[[noreturn]] void raise_python_error(PyGILState_STATE gil) {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  const bool accelerator = type != nullptr && PyType_Check(type) &&
                           std::string(reinterpret_cast<PyTypeObject*>(type)->tp_name) == "AcceleratorError";
  PyErr_Restore(type, value, trace);
  std::string message = python_error();
  PyGILState_Release(gil);
  if (accelerator) throw c10::AcceleratorError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, 0, message);
  TORCH_CHECK(false, message);
}

struct GraphImpl final : at::GraphImplInterface {
  PyObject* graph = nullptr;

  explicit GraphImpl(const at::GraphImplArgs& args) {
    PyGILState_STATE gil = PyGILState_Ensure();
    if (g_py_graph == nullptr) {
      PyGILState_Release(gil);
      TORCH_CHECK(false, "the sim's graphs are not installed");
    }
    graph = PyObject_CallFunction(g_py_graph, "O", args.keep_graph ? Py_True : Py_False);
    if (graph == nullptr) raise_python_error(gil);
    PyGILState_Release(gil);
  }

  ~GraphImpl() override {
    if (graph == nullptr || !Py_IsInitialized()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(graph);
    PyGILState_Release(gil);
  }

  // graph.<method>(*args) with `args` built by Py_BuildValue's `format`; the answer (a new reference).
  template <typename... A>
  PyObject* call(const char* method, const char* format, A... args) const {
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* answer = format == nullptr ? PyObject_CallMethod(graph, method, nullptr)
                                         : PyObject_CallMethod(graph, method, format, args...);
    if (answer == nullptr) raise_python_error(gil);
    PyGILState_Release(gil);
    return answer;
  }

  void done(PyObject* answer) const {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_DECREF(answer);
    PyGILState_Release(gil);
  }

  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode mode) override {
    static const char* modes[] = {"default", "global", "thread_local", "relaxed"};
    const char* name = modes[static_cast<int>(mode)];
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject* token = pool.first == 0 && pool.second == 0
                          ? (Py_INCREF(Py_None), Py_None)
                          : Py_BuildValue("(KK)", pool.first, pool.second);
    PyObject* method = PyObject_GetAttrString(graph, "capture_begin");
    PyObject* kwargs = Py_BuildValue("{s:O,s:s}", "pool", token, "capture_error_mode", name);
    PyObject* empty = PyTuple_New(0);
    PyObject* answer = method && kwargs && empty ? PyObject_Call(method, empty, kwargs) : nullptr;
    Py_XDECREF(token);
    Py_XDECREF(method);
    Py_XDECREF(kwargs);
    Py_XDECREF(empty);
    if (answer == nullptr) raise_python_error(gil);
    Py_DECREF(answer);
    PyGILState_Release(gil);
  }

  void capture_end() override { done(call("capture_end", nullptr)); }
  void instantiate() override { done(call("instantiate", nullptr)); }
  void replay() override { done(call("replay", nullptr)); }
  void reset() override { done(call("reset", nullptr)); }
  void enable_debug_mode() override { done(call("enable_debug_mode", nullptr)); }
  void debug_dump(const std::string& path) override { done(call("debug_dump", "s", path.c_str())); }

  at::MempoolId_t pool() const override {
    PyObject* token = call("pool", nullptr);
    PyGILState_STATE gil = PyGILState_Ensure();
    unsigned long long first = 0, second = 0;
    const bool ok = PyArg_ParseTuple(token, "KK", &first, &second);
    Py_DECREF(token);
    if (!ok) raise_python_error(gil);
    PyGILState_Release(gil);
    return {first, second};
  }
};
#endif

#ifdef FL_SIM_HAS_CAPABILITY
uint64_t dtype_bits() {
  if (g_dtypes_known.load() || g_py_dtypes == nullptr) return g_dtype_bits.load();
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* names = PyObject_CallFunction(g_py_dtypes, nullptr);
  PyObject* items = names == nullptr ? nullptr : PySequence_Fast(names, "dtype names must be a sequence");
  Py_XDECREF(names);
  if (items == nullptr) {
    std::string message = python_error();
    PyGILState_Release(gil);
    TORCH_CHECK(false, "the sim's dtypes: ", message);
  }
  std::vector<std::string> wanted;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); ++i) {
    const char* name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(items, i));
    if (name != nullptr) wanted.emplace_back(name);
  }
  PyErr_Clear();
  Py_DECREF(items);
  PyGILState_Release(gil);
  c10::DeviceCapability capability;
  capability.capability_data.capability_bits = 0;
#define FL_SIM_SET_DTYPE(_1, n)                                                                        \
  if (std::find(wanted.begin(), wanted.end(), std::string(c10::getDtypeNames(c10::ScalarType::n).first)) != \
      wanted.end())                                                                                    \
    capability.capability_data.supported_scalar_types.has_##n = 1;
  AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(FL_SIM_SET_DTYPE)
#undef FL_SIM_SET_DTYPE
  g_dtype_bits.store(capability.capability_data.capability_bits);
  g_dtypes_known.store(true);
  return capability.capability_data.capability_bits;
}
#endif

// The C++ route's registrations, for the life of the process (never destroyed, as the device guard
// and hooks are not: taking them out one by one at exit would only cost time).
torch::Library* g_library = nullptr;

Guard* g_guard = nullptr;
Hooks* g_hooks = nullptr;
ProfilerStubs* g_stubs = nullptr;
std::string g_error;

}  // namespace flsim

extern "C" {

// The interface version the Python loader checks before it calls anything else.
int fl_sim_abi() { return 7; }

// Register the guard, the hooks and the profiler stubs for `devices` devices. Returns 0, or 1 when
// PrivateUse1 already has hooks or a guard of another's (fl_sim_error says which), 2 on an error.
int fl_sim_register(int devices, int bfloat16) {
  using namespace flsim;
  try {
    if (devices < 1 || devices > kMaxDevices) {
      g_error = "device count out of range: " + std::to_string(devices);
      return 2;
    }
    g_devices.store(devices);
    g_bfloat16.store(bfloat16 != 0);
    if (g_guard != nullptr) return 0;
    if (at::isPrivateUse1HooksRegistered()) {
      g_error = "PrivateUse1 hooks are already registered by another backend";
      return 1;
    }
    if (c10::impl::hasDeviceGuardImpl(kType)) {
      g_error = "a PrivateUse1 device guard is already registered by another backend";
      return 1;
    }
    g_guard = new Guard();
    g_hooks = new Hooks();
    g_stubs = new ProfilerStubs();
    c10::impl::registerDeviceGuard(kType, g_guard);
    at::RegisterPrivateUse1HooksInterface(g_hooks);
    torch::profiler::impl::registerPrivateUse1Methods(g_stubs);
    register_ddp_timer();
    pthread_atfork(nullptr, nullptr, [] {
      if (flsim::g_used.load()) {  // a device context does not survive fork
        flsim::g_bad_fork.store(true);
        flsim::g_used.store(false);
      }
    });
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
    return 2;
  }
}

const char* fl_sim_error() { return flsim::g_error.c_str(); }

int fl_sim_current_device() { return flsim::t_device; }

// Make `index` the calling thread's current device; -1 if it names no device.
int fl_sim_set_device(int index) {
  if (index < 0 || index >= flsim::g_devices.load()) return -1;
  flsim::t_device = index;
  return 0;
}

// The devices were used in this process (what CUDA's primary context records).
void fl_sim_mark_used() { flsim::g_used.store(true); }

// Call noted() (GIL held) once, when the runtime itself uses the devices first. GIL held.
int fl_sim_set_first_use(PyObject* noted) {
  Py_INCREF(noted);
  PyObject* previous = flsim::g_py_first_use;
  flsim::g_py_first_use = noted;
  Py_XDECREF(previous);
  return 0;
}

int fl_sim_is_pinned(const void* data) { return flsim::g_pinned.contains(data) ? 1 : 0; }

// The calling thread's current stream on `device` (0: its default stream).
int64_t fl_sim_current_stream(int device) {
  if (device < 0 || device >= flsim::g_devices.load()) return 0;
  return flsim::t_streams[device];
}

// Make stream `id` of `device` the calling thread's current one there; returns the previous one.
int64_t fl_sim_exchange_stream(int device, int64_t id) {
  if (device < 0 || device >= flsim::g_devices.load()) return 0;
  const int64_t previous = flsim::t_streams[device];
  flsim::t_streams[device] = id;
  return previous;
}

// Ask names() for the dtypes a device holds (a sequence of names as c10 spells them: "float32",
// "bfloat16") when torch.accelerator.get_device_capability() is first asked. GIL held.
int fl_sim_set_dtypes(PyObject* names) {
  Py_INCREF(names);
  PyObject* previous = flsim::g_py_dtypes;
  flsim::g_py_dtypes = names;
  flsim::g_dtypes_known.store(false);
  Py_XDECREF(previous);
  return 0;
}

// Make graph(keep_graph) (a Python graph of the device) torch.accelerator.Graph's implementation
// for the device type, registered under its name as c10 spells it ("SIM", "NPU"). 1: this torch
// has no graph registry (before 2.12); 2 on an error (fl_sim_error says which). GIL held.
int fl_sim_set_graphs(PyObject* graph) {
#ifdef FL_SIM_HAS_GRAPH_IMPL
  using namespace flsim;
  try {
    Py_INCREF(graph);
    PyObject* previous = g_py_graph;
    g_py_graph = graph;
    Py_XDECREF(previous);
    const std::string key = c10::DeviceTypeName(kType, /*lower_case=*/false);
    if (!at::GraphImplRegistry()->Has(key)) {
      at::GraphImplRegistry()->Register(
          key, [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
            return std::make_unique<GraphImpl>(args);
          });
    }
    return 0;
  } catch (const std::exception& e) {
    flsim::g_error = e.what();
    return 2;
  }
#else
  (void)graph;
  return 1;
#endif
}

// Count every C++ route kernel's calls and host time from now on (on: the counts start from
// zero), or stop counting (off: the counts stay readable).
void fl_sim_count_calls(int on) {
  using namespace flsim;
  if (on) {
    std::lock_guard<std::mutex> hold(g_kernels_lock);
    for (SimKernel* k : g_kernels) {
      k->calls.store(0);
      k->ns.store(0);
    }
  }
  g_count.store(on != 0);
}

// Whether the calling thread's calls go uncounted (it runs a route, whose work they are).
void fl_sim_pause_counting(int paused) { flsim::t_count_paused = paused != 0; }

// The counts: {overload name: (calls, nanoseconds)} of the kernels called since counting began,
// a new dict (nullptr with a Python error set when one cannot be made). GIL held.
PyObject* fl_sim_call_counts() {
  using namespace flsim;
  PyObject* counts = PyDict_New();
  if (counts == nullptr) return nullptr;
  std::lock_guard<std::mutex> hold(g_kernels_lock);
  for (SimKernel* k : g_kernels) {
    const int64_t calls = k->calls.load();
    if (calls == 0) continue;
    PyObject* row = Py_BuildValue("(LL)", static_cast<long long>(calls), static_cast<long long>(k->ns.load()));
    if (row == nullptr || PyDict_SetItemString(counts, k->sig.name.c_str(), row) != 0) {
      Py_XDECREF(row);
      Py_DECREF(counts);
      return nullptr;
    }
    Py_DECREF(row);
  }
  return counts;
}

// Make the device's memory the caching allocators at `allocators` (one per device, made by
// fl_sim_alloc_new; they live as long as the process): the PrivateUse1 allocator (a
// DeviceAllocator, for torch.accelerator's memory questions), the CPU allocator that a native
// kernel's CPU kernel allocates sim memory through, and the pinned host allocator of the
// accelerator. 0, or 2 on an error (fl_sim_error says which).
int fl_sim_install_memory(void** allocators, int count) {
  using namespace flsim;
  try {
    if (count != g_devices.load()) {
      g_error = "expected " + std::to_string(g_devices.load()) + " allocators, got " + std::to_string(count);
      return 2;
    }
    for (int i = 0; i < count; ++i) g_allocators[i] = static_cast<CachingAllocator*>(allocators[i]);
    if (g_cpu_allocator.host == nullptr) {
      g_cpu_allocator.host = g_host_allocator = c10::GetCPUAllocator();
      c10::SetCPUAllocator(&g_cpu_allocator, 255);
      c10::SetAllocator(kType, &g_sim_allocator, 255);
      at::setHostAllocator(kType, &g_pinned, 255);
    }
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
    return 2;
  }
}

// scaled_dot_product_attention asks a device's own choice of fused kernel through a dispatch stub
// (math when the device registers none). With `on`, the sim's choice is the host's: the
// _fused_sdp_choice operator, which the native set then runs as the CPU does, and a choice of
// flash runs _scaled_dot_product_flash_attention_for_cpu (and its backward) natively. Without it
// the stub is cleared and the attention runs the math composite, as before.
static int64_t sim_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                    const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale, bool enable_gqa) {
  return at::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

int fl_sim_set_fused_attention(int on) {
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(on ? &sim_fused_sdp_choice : nullptr);
  return 0;
}

// Register the C++ route's kernel for each overload in `names` (one a line, "aten::add.Tensor",
// "aten::relu"). Returns how many, or -1 (fl_sim_error says why).
int fl_sim_register_kernels(const char* names) {
  using namespace flsim;
  try {
    if (g_library == nullptr) {
      g_library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    }
    int count = 0;
    std::string all(names);
    size_t at = 0;
    while (at < all.size()) {
      size_t end = all.find('\n', at);
      if (end == std::string::npos) end = all.size();
      const std::string full = all.substr(at, end - at);
      at = end + 1;
      if (full.empty()) continue;
      const std::string bare = full.substr(full.find("::") + 2);
      const size_t dot = bare.find('.');
      const std::string packet = bare.substr(0, dot);
      const std::string overload = dot == std::string::npos ? "" : bare.substr(dot + 1);
      if (full == "aten::empty.memory_format") {
        g_library->impl(bare.c_str(), TORCH_FN(sim_empty));
      } else if (full == "aten::empty_strided") {
        g_library->impl(bare.c_str(), TORCH_FN(sim_empty_strided));
      } else if (full == "aten::copy_") {
        g_library->impl(bare.c_str(), TORCH_FN(sim_copy_));
      } else if (full == "aten::_copy_from") {
        g_library->impl(bare.c_str(), TORCH_FN(sim_copy_from));
      } else if (full == "aten::is_set_to") {  // a question about storages, as every device's
        g_library->impl(bare.c_str(), TORCH_FN(at::native::is_set_to));
      } else if (full == "aten::view") {  // views: a new tensor on the same storage, as CUDA's
        g_library->impl(bare.c_str(), TORCH_FN(at::native::view));
      } else if (full == "aten::as_strided") {
        g_library->impl(bare.c_str(), TORCH_FN(at::native::as_strided_tensorimpl));
      } else if (full == "aten::_reshape_alias") {
        g_library->impl(bare.c_str(), TORCH_FN(at::native::_reshape_alias));
      } else {
        auto op = c10::Dispatcher::singleton().findSchemaOrThrow(("aten::" + packet).c_str(), overload.c_str());
        g_library->impl(bare.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                          std::make_unique<SimKernel>(signature_of(op))));
      }
      ++count;
    }
    return count;
  } catch (const std::exception& e) {
    g_error = e.what();
    return -1;
  }
}

// Whether the storage at `impl` (a StorageImpl*, Python's storage._cdata) holds its own block of
// sim memory (not a slice of another storage).
int fl_sim_owns_block(void* impl) {
  return static_cast<c10::StorageImpl*>(impl)->data_ptr().get_deleter() == &flsim::sim_delete ? 1 : 0;
}

// Give the sim storage at `impl` a new block of `nbytes` bytes of device `device` in place,
// keeping the leading bytes both sizes have. 0, or 2 (fl_sim_error says why).
int fl_sim_resize_storage(void* impl, int64_t nbytes, int device) {
  using namespace flsim;
  try {
    auto* storage = static_cast<c10::StorageImpl*>(impl);
    const c10::Device on(kType, static_cast<c10::DeviceIndex>(device));
    const size_t keep = std::min(storage->nbytes(), static_cast<size_t>(nbytes));
    storage->set_data_ptr_noswap(sim_block_holding(device, static_cast<size_t>(nbytes), on, storage->data(), keep));
    storage->set_nbytes(static_cast<size_t>(nbytes));
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
    return 2;
  }
}

}  // extern "C"
