// The sim's native runtime: what PyTorch's C++ side asks of an accelerator on PrivateUse1 and a
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
//    and the report of device memory to a profiler that records memory (fl_sim_report_memory);
//  * a DDP timer (DDP's logger measures forward, backward and communication per device type).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/profiler/stubs/base.h>

#if __has_include(<torch/csrc/distributed/c10d/reducer_timer.hpp>)
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#define FL_SIM_HAS_DDP_TIMER 1
#endif

#if __has_include(<c10/core/DeviceCapability.h>)
#include <c10/core/DeviceCapability.h>
#define FL_SIM_HAS_CAPABILITY 1
#endif

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace flsim {

constexpr int kMaxDevices = 64;
constexpr int kPoolSize = 32;  // streams per priority per device
constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

std::atomic<int> g_devices{0};
std::atomic<bool> g_bfloat16{true};
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
struct PinnedAllocator final : public c10::Allocator {
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

Guard* g_guard = nullptr;
Hooks* g_hooks = nullptr;
ProfilerStubs* g_stubs = nullptr;
std::string g_error;

}  // namespace flsim

extern "C" {

// The interface version the Python loader checks before it calls anything else.
int fl_sim_abi() { return 2; }

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
void fl_sim_mark_used(int used) { flsim::g_used.store(used != 0); }

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

// Whether a profiler that records memory is running on the calling thread (profile_memory=True).
int fl_sim_memory_profiling() { return c10::memoryProfilingEnabled() ? 1 : 0; }

// Report to that profiler `delta` bytes allocated (negative: freed) at `ptr` on sim device
// `device`, with the device's allocated and reserved bytes after the change: what a C++ caching
// allocator reports, so the profiler attributes the bytes to the operator that allocated them.
void fl_sim_report_memory(void* ptr, int64_t delta, uint64_t allocated, uint64_t reserved, int device) {
  if (device < 0 || device >= flsim::g_devices.load()) return;
  c10::reportMemoryUsageToProfiler(ptr, delta, allocated, reserved,
                                   c10::Device(flsim::kType, static_cast<c10::DeviceIndex>(device)));
}

}  // extern "C"
