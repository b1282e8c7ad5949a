// The sim device's caching allocator in C++ (allocator.h), and the C functions through which
// Python holds one (flagos_torchfl/sim/runtime/cpp/allocator.py).
#include "allocator.h"

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace flsim {

namespace {

size_t round_size(size_t nbytes) {
  return (nbytes + kBlockRound - 1) / kBlockRound * kBlockRound;
}

std::string format_fraction(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

}  // namespace

std::string format_size(int64_t nbytes) {
  double value = static_cast<double>(nbytes);
  const char* units[] = {"bytes", "KiB", "MiB", "GiB"};
  for (int i = 0; i < 4; ++i) {
    if (std::abs(value) < 1024 || i == 3) {
      if (i == 0) return std::to_string(static_cast<int64_t>(value)) + " bytes";
      char text[48];
      std::snprintf(text, sizeof(text), "%.2f %s", value, units[i]);
      return text;
    }
    value /= 1024;
  }
  return "";
}

CachingAllocator::CachingAllocator(int index, int64_t limit, std::string device)
    : index_(index), device_(std::move(device)), limit_(limit < 0 ? -1 : limit) {}

CachingAllocator::~CachingAllocator() {
  auto drop = [](FreeLists& lists) {
    for (Block* b : lists.first) delete b;
    for (Block* b : lists.second) delete b;
  };
  drop(own_);
  for (auto& entry : graph_free_) drop(entry.second);
  for (auto& entry : live_) delete entry.second;
  for (Segment* s : segments_) {
    std::free(s->base);
    delete s;
  }
}

void CachingAllocator::set_limit(int64_t limit) {
  std::lock_guard<std::mutex> hold(lock_);
  limit_ = limit < 0 ? -1 : limit;
}

void CachingAllocator::set_fraction(double fraction) {
  std::lock_guard<std::mutex> hold(lock_);
  fraction_ = fraction;
}

FreeList& CachingAllocator::free_list(const Segment* segment) {
  FreeLists& lists = segment->graph ? graph_free_[segment->token] : own_;
  return segment->large ? lists.second : lists.first;
}

void CachingAllocator::count_block(const Block* block, bool add) {
  const int groups[] = {0, block->segment->large ? 2 : 1};
  for (int g : groups) {
    if (add) {
      stats_[kAllocation][g].increase(1);
      stats_[kAllocatedBytes][g].increase(static_cast<int64_t>(block->size));
      stats_[kRequestedBytes][g].increase(static_cast<int64_t>(block->requested));
    } else {
      stats_[kAllocation][g].decrease(1);
      stats_[kAllocatedBytes][g].decrease(static_cast<int64_t>(block->size));
      stats_[kRequestedBytes][g].decrease(static_cast<int64_t>(block->requested));
    }
  }
}

void* CachingAllocator::allocate(size_t nbytes, size_t* size_out) {
  if (size_out != nullptr) *size_out = 0;
  if (nbytes == 0) return nullptr;
  const size_t size = round_size(nbytes);
  const bool large = size > kSmallRequest;
  char* ptr;
  size_t got;
  int64_t allocated, reserved;
  {
    std::lock_guard<std::mutex> hold(lock_);
    const PoolToken* token = nullptr;
    if (!routes_.empty()) {
      auto route = routes_.find(std::this_thread::get_id());
      if (route != routes_.end()) token = &route->second.back();
    }
    Block* block = take_cached(size, large, token);
    if (block == nullptr) block = new_segment_block(size, nbytes, large, token);
    block->free = false;
    block->requested = nbytes;
    block->segment->live += 1;
    count_block(block, true);
    live_[block->ptr] = block;
    ptr = block->ptr;
    got = block->size;
    allocated = stats_[kAllocatedBytes][0].current;
    reserved = stats_[kReservedBytes][0].current;
  }
  if (size_out != nullptr) *size_out = got;
  report(ptr, static_cast<int64_t>(got), allocated, reserved);
  return ptr;
}

void CachingAllocator::report(void* ptr, int64_t delta, int64_t allocated, int64_t reserved) const {
  if (!c10::memoryProfilingEnabled()) return;
  c10::reportMemoryUsageToProfiler(ptr, delta, allocated, reserved,
                                   c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index_)));
}

Block* CachingAllocator::take_cached(size_t size, bool large, const PoolToken* token) {
  FreeLists& lists = token != nullptr ? graph_free_[*token] : own_;
  FreeList& free = large ? lists.second : lists.first;
  Block probe{nullptr, nullptr, size};
  auto it = free.lower_bound(&probe);
  if (it == free.end()) return nullptr;
  Block* block = *it;
  free.erase(it);
  split(block, size);
  return block;
}

void CachingAllocator::split(Block* block, size_t size) {
  const size_t rest = block->size - size;
  if (rest < kBlockRound) return;
  Block* tail = new Block{block->segment, block->ptr + size, rest};
  tail->prev = block;
  tail->next = block->next;
  if (block->next != nullptr) block->next->prev = tail;
  block->next = tail;
  block->size = size;
  free_list(tail->segment).insert(tail);
}

int64_t CachingAllocator::segment_size(size_t size, bool large) const {
  const int64_t room = allowed() - stats_[kReservedBytes][0].current;
  const int64_t want = static_cast<int64_t>(size);
  if (room < want) return -1;
  if (large) return want;
  return std::min(static_cast<int64_t>(kSmallSegment), room - room % static_cast<int64_t>(kBlockRound));
}

Block* CachingAllocator::new_segment_block(size_t size, size_t nbytes, bool large, const PoolToken* token) {
  int64_t seg_size = segment_size(size, large);
  if (seg_size < 0) {
    num_alloc_retries_ += 1;
    release_free_segments();
    seg_size = segment_size(size, large);
  }
  if (seg_size < 0) raise_oom(nbytes, size, false);
  void* base = std::aligned_alloc(64, static_cast<size_t>(seg_size));
  if (base == nullptr) {  // the host itself is out of memory
    release_free_segments();
    base = std::aligned_alloc(64, static_cast<size_t>(seg_size));
    if (base == nullptr) raise_oom(nbytes, size, true);
  }
  auto* segment = new Segment{static_cast<char*>(base), static_cast<size_t>(seg_size), large,
                              token != nullptr, token != nullptr ? *token : PoolToken{0, 0}, serial_++};
  segments_.insert(segment);
  for (int g : {0, large ? 2 : 1}) {
    stats_[kSegment][g].increase(1);
    stats_[kReservedBytes][g].increase(seg_size);
  }
  Block* block = new Block{segment, segment->base, segment->size};
  split(block, size);
  return block;
}

void CachingAllocator::raise_oom(size_t nbytes, size_t size, bool host) {
  num_ooms_ += 1;
  const int64_t reserved = stats_[kReservedBytes][0].current;
  const int64_t allocated = stats_[kAllocatedBytes][0].current;
  std::string cap = limit_ >= 0 ? "memory limit of " + format_size(limit_) + " (" + std::to_string(limit_) + " bytes)"
                                : "nominal capacity of " + format_size(kNominalTotalMemory);
  if (fraction_ < 1.0) {
    cap += ", of which this process may use " + format_fraction(fraction_) + " (" + format_size(allowed()) +
           ", set_per_process_memory_fraction)";
  }
  const std::string why = host ? "the host could not provide the memory" : "the device has a " + cap;
  std::string advice = "lower the batch size or free tensors you no longer need";
  if (!host) {
    advice += "; raise the limit (memory_virtual_limit / FL_MEMORY_VIRTUAL_LIMIT, or "
              "flagos_torchfl.sim.set_memory_limit)";
  }
  if (reserved - allocated >= static_cast<int64_t>(size)) {
    advice += "; " + format_size(reserved - allocated) +
              " are free only in pieces of partly used segments (fragmentation): keep long-lived "
              "tensors together, or clear the cache regularly (memory_pool_clear_interval)";
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false, device_, " out of memory: tried to allocate ",
                   format_size(static_cast<int64_t>(nbytes)), " (", nbytes, " bytes, ", size, " rounded); ", why,
                   "; ", format_size(allocated), " allocated, ", format_size(reserved), " reserved, ",
                   format_size(std::max<int64_t>(capacity() - reserved, 0)), " free. To fit: ", advice, ".");
}

bool CachingAllocator::release(void* ptr) {
  Block* block;
  size_t size;
  int64_t allocated, reserved;
  {
    std::lock_guard<std::mutex> hold(lock_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return false;
    block = it->second;
    live_.erase(it);
    size = block->size;
    count_block(block, false);
    block->segment->live -= 1;
    block->free = true;
    block->requested = 0;
    Block* neighbours[] = {block->prev, block->next};
    for (Block* other : neighbours) {
      if (other != nullptr && other->free) {
        free_list(other->segment).erase(other);
        merge(block, other);
      }
    }
    free_list(block->segment).insert(block);
    allocated = stats_[kAllocatedBytes][0].current;
    reserved = stats_[kReservedBytes][0].current;
  }
  report(ptr, -static_cast<int64_t>(size), allocated, reserved);
  return true;
}

void CachingAllocator::merge(Block* block, Block* other) {
  if (other == block->prev) {
    block->ptr = other->ptr;
    block->prev = other->prev;
    if (other->prev != nullptr) other->prev->next = block;
  } else {
    block->next = other->next;
    if (other->next != nullptr) other->next->prev = block;
  }
  block->size += other->size;
  delete other;
}

int64_t CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> hold(lock_);
  return release_free_segments();
}

int64_t CachingAllocator::release_free_segments() {
  int64_t released = 0;
  auto sweep = [&](FreeList& free) {
    for (auto it = free.begin(); it != free.end();) {
      Block* block = *it;
      Segment* segment = block->segment;
      if (block->prev == nullptr && block->next == nullptr && segment->live == 0) {
        it = free.erase(it);
        segments_.erase(segment);
        released += static_cast<int64_t>(segment->size);
        for (int g : {0, segment->large ? 2 : 1}) {
          stats_[kSegment][g].decrease(1);
          stats_[kReservedBytes][g].decrease(static_cast<int64_t>(segment->size));
        }
        std::free(segment->base);
        delete segment;
        delete block;
      } else {
        ++it;
      }
    }
  };
  sweep(own_.first);
  sweep(own_.second);
  for (auto it = graph_free_.begin(); it != graph_free_.end();) {
    auto users = pool_users_.find(it->first);
    if (users != pool_users_.end() && users->second > 0) {
      ++it;
      continue;
    }
    sweep(it->second.first);
    sweep(it->second.second);
    const PoolToken token = it->first;
    const bool held = std::any_of(segments_.begin(), segments_.end(),
                                  [&](const Segment* s) { return s->graph && s->token == token; });
    if (held) {
      ++it;
    } else {  // a pool with neither users nor segments is forgotten
      if (users != pool_users_.end()) pool_users_.erase(users);
      it = graph_free_.erase(it);
    }
  }
  return released;
}

void CachingAllocator::retain_pool(PoolToken token) {
  std::lock_guard<std::mutex> hold(lock_);
  pool_users_[token] += 1;
  graph_free_[token];
}

bool CachingAllocator::release_pool(PoolToken token) {
  std::lock_guard<std::mutex> hold(lock_);
  auto users = pool_users_.find(token);
  if (users == pool_users_.end() || users->second <= 0) return false;
  users->second -= 1;
  return true;
}

bool CachingAllocator::enter(PoolToken token) {
  std::lock_guard<std::mutex> hold(lock_);
  auto users = pool_users_.find(token);
  if (users == pool_users_.end() || users->second <= 0) return false;
  routes_[std::this_thread::get_id()].push_back(token);
  return true;
}

void CachingAllocator::leave() {
  std::lock_guard<std::mutex> hold(lock_);
  auto route = routes_.find(std::this_thread::get_id());
  if (route == routes_.end()) return;
  route->second.pop_back();
  if (route->second.empty()) routes_.erase(route);
}

int64_t CachingAllocator::pool_reserved(PoolToken token) {
  std::lock_guard<std::mutex> hold(lock_);
  int64_t total = 0;
  for (const Segment* s : segments_) {
    if (s->graph && s->token == token) total += static_cast<int64_t>(s->size);
  }
  return total;
}

void CachingAllocator::stats(int64_t* out) {
  std::lock_guard<std::mutex> hold(lock_);
  for (int name = 0; name < kStatNames; ++name) {
    for (int g = 0; g < kGroups; ++g) {
      const Stat& s = stats_[name][g];
      *out++ = s.current;
      *out++ = s.peak;
      *out++ = s.allocated;
      *out++ = s.freed;
    }
  }
  *out++ = num_alloc_retries_;
  *out++ = num_ooms_;
}

int64_t CachingAllocator::allocated() {
  std::lock_guard<std::mutex> hold(lock_);
  return stats_[kAllocatedBytes][0].current;
}

int64_t CachingAllocator::reserved() {
  std::lock_guard<std::mutex> hold(lock_);
  return stats_[kReservedBytes][0].current;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> hold(lock_);
  for (auto& row : stats_) {
    for (Stat& s : row) s.peak = s.current;
  }
}

void CachingAllocator::reset_accumulated() {
  std::lock_guard<std::mutex> hold(lock_);
  for (auto& row : stats_) {
    for (Stat& s : row) s.allocated = s.freed = 0;
  }
  num_alloc_retries_ = num_ooms_ = 0;
}

}  // namespace flsim

// ---- The C functions Python holds an allocator through (ctypes; no Python objects) ----------
namespace {
thread_local std::string t_alloc_error;

flsim::CachingAllocator* of(void* handle) { return static_cast<flsim::CachingAllocator*>(handle); }
}  // namespace

extern "C" {

// A new allocator of device `index` (`limit` < 0: none; `device`: its name in errors).
void* fl_sim_alloc_new(int index, int64_t limit, const char* device) {
  return new flsim::CachingAllocator(index, limit, device);
}

// Destroy an allocator no device holds, with the host memory of every segment it reserved.
void fl_sim_alloc_delete(void* handle) { delete of(handle); }

// Why the calling thread's last fl_sim_alloc_take failed.
const char* fl_sim_alloc_error() { return t_alloc_error.c_str(); }

// A block of at least `nbytes` bytes: its address in *ptr (0 for 0 bytes), size in *size.
// 0; 1 when out of memory, 2 on another error (fl_sim_alloc_error says why).
int fl_sim_alloc_take(void* handle, int64_t nbytes, uint64_t* ptr, int64_t* size) {
  try {
    size_t got = 0;
    *ptr = reinterpret_cast<uint64_t>(of(handle)->allocate(static_cast<size_t>(nbytes), &got));
    *size = static_cast<int64_t>(got);
    return 0;
  } catch (const c10::OutOfMemoryError& e) {
    t_alloc_error = e.what_without_backtrace();
    return 1;
  } catch (const std::exception& e) {
    t_alloc_error = e.what();
    return 2;
  }
}

// Give back the block at `ptr`: 0, or 1 when no live block of the allocator starts there.
int fl_sim_alloc_give(void* handle, uint64_t ptr) {
  return of(handle)->release(reinterpret_cast<void*>(ptr)) ? 0 : 1;
}

int64_t fl_sim_alloc_empty_cache(void* handle) { return of(handle)->empty_cache(); }
int64_t fl_sim_alloc_limit(void* handle) { return of(handle)->limit(); }
void fl_sim_alloc_set_limit(void* handle, int64_t limit) { of(handle)->set_limit(limit); }
double fl_sim_alloc_fraction(void* handle) { return of(handle)->fraction(); }
void fl_sim_alloc_set_fraction(void* handle, double fraction) { of(handle)->set_fraction(fraction); }
int64_t fl_sim_alloc_allocated(void* handle) { return of(handle)->allocated(); }
int64_t fl_sim_alloc_reserved(void* handle) { return of(handle)->reserved(); }

// Write the statistics (CachingAllocator::kStatValues of them) to `out`.
void fl_sim_alloc_stats(void* handle, int64_t* out) { of(handle)->stats(out); }
int fl_sim_alloc_stat_values() { return flsim::CachingAllocator::kStatValues; }

// `what`: 0 sets every peak to its current value, 1 zeroes the cumulative counters.
void fl_sim_alloc_reset(void* handle, int what) {
  if (what == 0) {
    of(handle)->reset_peak();
  } else {
    of(handle)->reset_accumulated();
  }
}

void fl_sim_alloc_retain_pool(void* handle, int64_t a, int64_t b) { of(handle)->retain_pool({a, b}); }
// 0, or 1 when no graph uses the pool.
int fl_sim_alloc_release_pool(void* handle, int64_t a, int64_t b) { return of(handle)->release_pool({a, b}) ? 0 : 1; }
// 0, or 1 when no graph uses the pool.
int fl_sim_alloc_enter(void* handle, int64_t a, int64_t b) { return of(handle)->enter({a, b}) ? 0 : 1; }
void fl_sim_alloc_leave(void* handle) { of(handle)->leave(); }
int64_t fl_sim_alloc_pool_reserved(void* handle, int64_t a, int64_t b) { return of(handle)->pool_reserved({a, b}); }

}  // extern "C"
