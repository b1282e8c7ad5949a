// The sim device's caching allocator in C++: the policy of flagos_torchfl/sim/runtime/allocator.py
// (its module docstring is the specification, and the Python runtime keeps that implementation),
// so that the C++ runtime's allocations and releases never enter Python. One CachingAllocator per
// device; the Python side reaches it through the fl_sim_alloc_* functions (allocator.cpp).
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <mutex>

namespace flsim {

constexpr size_t kBlockRound = 512;
constexpr size_t kSmallRequest = size_t{1} << 20;
constexpr size_t kSmallSegment = size_t{2} << 20;
constexpr int64_t kNominalTotalMemory = int64_t{16} << 30;

// A graph pool's token (torch.cuda.graph_pool_handle's pair).
using PoolToken = std::pair<int64_t, int64_t>;

struct Stat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void increase(int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
};

// The statistics, in the order fl_sim_alloc_stats writes them (then the groups all, small_pool,
// large_pool; then current, peak, allocated, freed).
enum StatName { kAllocation, kSegment, kAllocatedBytes, kReservedBytes, kRequestedBytes, kStatNames };
constexpr int kGroups = 3;

struct Segment;

struct Block {
  Segment* segment;
  char* ptr;
  size_t size;
  size_t requested = 0;
  bool free = true;
  Block* prev = nullptr;
  Block* next = nullptr;
};

struct Segment {
  char* base;
  size_t size;
  bool large;
  bool graph;       // a graph pool's (token) rather than the device's own pools
  PoolToken token;
  int64_t serial;   // the allocator's segments are numbered in the order they were made
  int live = 0;     // blocks handed out
};

// Free blocks, best fit first: by size, then the oldest segment, then the lowest address (so the
// choice does not depend on where the host placed the segments).
struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    const int64_t sa = a->segment == nullptr ? -1 : a->segment->serial;
    const int64_t sb = b->segment == nullptr ? -1 : b->segment->serial;
    return sa != sb ? sa < sb : a->ptr < b->ptr;
  }
};
using FreeList = std::set<Block*, BySize>;

// A size pool's two free lists: small (index 0) and large (1).
using FreeLists = std::pair<FreeList, FreeList>;

class CachingAllocator {
 public:
  // `limit` < 0: no limit (the nominal capacity); `device`: the name errors give ("sim:0").
  CachingAllocator(int index, int64_t limit, std::string device);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `nbytes` bytes (nullptr for 0), its size in `*size`; throws
  // c10::OutOfMemoryError. A profiler that records memory on the calling thread is told.
  void* allocate(size_t nbytes, size_t* size = nullptr);
  // Give back the live block at `ptr`; false (and nothing changes) when none starts there.
  bool release(void* ptr);
  // Give every wholly free segment back to the host; the bytes released.
  int64_t empty_cache();

  int64_t limit() const { return limit_; }
  void set_limit(int64_t limit);
  double fraction() const { return fraction_; }
  void set_fraction(double fraction);
  int64_t capacity() const { return limit_ < 0 ? kNominalTotalMemory : limit_; }
  int64_t allowed() const { return static_cast<int64_t>(static_cast<double>(capacity()) * fraction_); }

  // Graph pools: a graph begins / stops using the pool `token`; the calling thread's requests
  // take the pool's memory between enter(token) and leave(). False: the pool is not in use.
  void retain_pool(PoolToken token);
  bool release_pool(PoolToken token);
  bool enter(PoolToken token);
  void leave();
  int64_t pool_reserved(PoolToken token);

  // Statistics: kStatNames x kGroups x 4 values, then num_alloc_retries and num_ooms.
  static constexpr int kStatValues = kStatNames * kGroups * 4 + 2;
  void stats(int64_t* out);
  int64_t allocated();
  int64_t reserved();
  void reset_peak();
  void reset_accumulated();

 private:
  FreeList& free_list(const Segment* segment);
  Block* take_cached(size_t size, bool large, const PoolToken* token);
  Block* new_segment_block(size_t size, size_t nbytes, bool large, const PoolToken* token);
  int64_t segment_size(size_t size, bool large) const;
  [[noreturn]] void raise_oom(size_t nbytes, size_t size, bool host);
  void split(Block* block, size_t size);
  void merge(Block* block, Block* other);
  int64_t release_free_segments();
  void count_block(const Block* block, bool add);
  // Tell a profiler that records memory on the calling thread that `delta` bytes at `ptr` changed.
  void report(void* ptr, int64_t delta, int64_t allocated, int64_t reserved) const;

  const int index_;
  const std::string device_;
  int64_t limit_;
  double fraction_ = 1.0;
  std::mutex lock_;
  FreeLists own_;                                  // the device's pools
  std::map<PoolToken, FreeLists> graph_free_;      // graph pools' free lists
  std::map<PoolToken, int> pool_users_;            // graph pools: how many graphs use each
  std::unordered_map<std::thread::id, std::vector<PoolToken>> routes_;  // threads allocating to a pool
  std::unordered_set<Segment*> segments_;
  int64_t serial_ = 0;                             // the number the next segment gets
  std::unordered_map<void*, Block*> live_;         // blocks handed out, by address
  Stat stats_[kStatNames][kGroups];
  int64_t num_alloc_retries_ = 0;
  int64_t num_ooms_ = 0;
};

// "1.50 MiB": `nbytes` in the largest binary unit that keeps it above 1.
std::string format_size(int64_t nbytes);

}  // namespace flsim
