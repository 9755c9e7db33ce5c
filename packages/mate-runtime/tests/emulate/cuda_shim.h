// The CUDA constructs of MATE's decode kernels (the SSU / ReplaySSM kernels: registers, shared memory and
// __syncthreads, warp shuffles, cp.async as a synchronous copy; the fused decode step's atomics and fences; programmatic dependent launch; no tensor cores, no bulk copies), for running TileLang's generated CUDA
// source as C++ on the CPU (tests/emulate/cuda_emulator.py). A CTA's threads are std::threads; a warp shuffle is an
// exchange through a CTA-wide buffer between two barriers, which is exact when every thread of the CTA reaches the
// same shuffles (the kernels' shuffles are all outside lane-dependent branches); __syncthreads is the CTA's
// barrier, the dynamic shared memory one buffer and a static shared array a static local (the CTAs run one after another). Types convert as the device does: bf16 / fp16 / fp8-e4m3 round to nearest even, fp8
// saturating to +-448.
#pragma once
#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)

typedef unsigned int uint;
typedef unsigned char uchar;
typedef unsigned short ushort;

struct Dim3 {
  int x, y, z;
};
inline thread_local Dim3 threadIdx, blockIdx;

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct bfloat16_t {
  uint16_t v;
  bfloat16_t() = default;
  bfloat16_t(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      v = 0x7fc0;
    } else {
      v = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  operator float() const { return bits_f32((uint32_t)v << 16); }
};

inline uint16_t f32_to_f16_bits(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                     // below the smallest normal: subnormal or zero
    float m = bits_f32(a) * 16777216.0f;                     // * 2^24: the subnormal's integer
    return (uint16_t)(sign | (uint32_t)std::nearbyint(m));
  }
  uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}
inline float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) return bits_f32(sign) + (sign ? -1.0f : 1.0f) * (float)m * 5.9604644775390625e-08f;
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

struct half_t {
  uint16_t v;
  half_t() = default;
  half_t(float f) : v(f32_to_f16_bits(f)) {}
  operator float() const { return f16_bits_to_f32(v); }
};

// fp8 e4m3 (finite, max 448, no inf)
inline uint8_t f32_to_e4m3_sat(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  float a = std::fabs(f);
  if (std::isnan(f)) return (uint8_t)(sign | 0x7f);
  if (a >= 448.0f) return (uint8_t)(sign | 0x7e);
  if (a < 0.015625f) {  // below 2^-6: subnormals of step 2^-9
    int q = (int)std::nearbyint(a * 512.0f);
    return (uint8_t)(sign | (uint8_t)q);  // q == 8 is the smallest normal's encoding
  }
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  float step = std::ldexp(1.0f, e - 1 - 3);
  float q = std::nearbyint(a / step) * step;
  if (q >= 448.0f) return (uint8_t)(sign | 0x7e);
  std::frexp(q, &e);
  int E = e - 1 + 7;
  int M = (int)std::nearbyint((q / std::ldexp(1.0f, e - 1) - 1.0f) * 8.0f);
  return (uint8_t)(sign | (E << 3) | M);
}
inline float e4m3_to_f32(uint8_t b) {
  float sign = (b & 0x80) ? -1.0f : 1.0f;
  int E = (b >> 3) & 0xf, M = b & 7;
  if (E == 15 && M == 7) return NAN;
  if (E == 0) return sign * std::ldexp((float)M, -9);
  return sign * std::ldexp(1.0f + M / 8.0f, E - 7);
}

struct fp8_e4_t {
  uint8_t v;
  fp8_e4_t() = default;
  fp8_e4_t(float f) : v(f32_to_e4m3_sat(f)) {}
  operator float() const { return e4m3_to_f32(v); }
};
struct fp8_e4_4_t {
  fp8_e4_t x[4];
};
struct fp8_e4_16_t {
  fp8_e4_t x[16];
};
typedef uint16_t __nv_fp8x2_storage_t;
enum { __NV_E4M3 = 0, __NV_SATFINITE = 1 };

struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
struct uint2 {
  uint x, y;
};
struct uint4 {
  uint x, y, z, w;
};
struct int2 {
  int x, y;
};
struct int4 {
  int x, y, z, w;
};
struct char4 {
  signed char x, y, z, w;
};

inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint2 make_uint2(uint x, uint y) { return uint2{x, y}; }
inline uint4 make_uint4(uint x, uint y, uint z, uint w) { return uint4{x, y, z, w}; }
inline uint __pack_nv_bfloat162(bfloat16_t x, bfloat16_t y) { return (uint)x.v | ((uint)y.v << 16); }
// the paired conversions TileLang emits for a vectorised cast of two 16-bit floats
struct __nv_bfloat162 {
  bfloat16_t x, y;
};
struct half2 {
  half_t x, y;
};
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return float2{(float)v.x, (float)v.y}; }
inline float2 __half22float2(half2 v) { return float2{(float)v.x, (float)v.y}; }
inline uint __pack_half2(half_t x, half_t y) { return (uint)x.v | ((uint)y.v << 16); }
inline uint __pack_half2(bfloat16_t x, bfloat16_t y) { return (uint)x.v | ((uint)y.v << 16); }

typedef half2 __half2;
typedef __nv_bfloat162 nv_bfloat162;  // cuda_bf16.h's alias (a vectorised bf16 <-> fp16 cast names it)
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __nv_bfloat162{bfloat16_t(v.x), bfloat16_t(v.y)}; }
inline half2 __float22half2_rn(float2 v) { return half2{half_t(v.x), half_t(v.y)}; }
// TileLang's packed x2 arithmetic (tl_templates/cuda/common.h): a pair of 16-bit floats is a ``uint1`` in the
// generated code; a product of two 16-bit floats is exact in fp32, so rounding it once is the device's HMUL2
struct uint1 {
  uint x;
};
namespace tl {
template <typename T>
T from_uint1(uint1 v) {
  T r;
  std::memcpy(&r, &v, sizeof(T));
  return r;
}
template <typename T>
uint1 to_uint1(T v) {
  uint1 r;
  std::memcpy(&r, &v, sizeof(T));
  return r;
}
inline __nv_bfloat162 mul2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __nv_bfloat162{bfloat16_t((float)a.x * (float)b.x), bfloat16_t((float)a.y * (float)b.y)};
}
inline half2 mul2(half2 a, half2 b) { return half2{half_t((float)a.x * (float)b.x), half_t((float)a.y * (float)b.y)}; }
}  // namespace tl

inline float2 __tl_cvt_fp8x2_to_float2(__nv_fp8x2_storage_t s, int) {
  return float2{e4m3_to_f32((uint8_t)(s & 0xff)), e4m3_to_f32((uint8_t)(s >> 8))};
}
inline __nv_fp8x2_storage_t __nv_cvt_float2_to_fp8x2(float2 v, int, int) {
  return (__nv_fp8x2_storage_t)(f32_to_e4m3_sat(v.x) | (f32_to_e4m3_sat(v.y) << 8));
}

// A vector access ``*(T*)(p)`` of the generated code goes through ``vec<T>(p)`` (cuda_emulator.py rewrites it):
// into a tensor (``global_ranges``) the address must be aligned to the vector's size, as the device requires, or
// the access is counted in ``misaligned`` (the vector structs above carry no alignment of their own, so local
// arrays of narrower elements can be viewed as they are on the device).
struct Range {
  uintptr_t lo, hi;
};
inline std::vector<Range> global_ranges;
inline std::atomic<long> misaligned{0};
template <typename T, typename P>
T* vec(P* p) {
  uintptr_t a = (uintptr_t)p;
  if (sizeof(T) > 1 && (a % sizeof(T)) != 0) {
    for (const Range& r : global_ranges)
      if (a >= r.lo && a < r.hi) {
        misaligned++;
        break;
      }
  }
  return (T*)p;
}

// byte permute (PRMT): result byte i is byte (s >> 4i) & 7 of the 8 bytes of (y:x), x the low four
inline uint __byte_perm(uint x, uint y, uint s) {
  uint64_t v = ((uint64_t)y << 32) | x;
  uint r = 0;
  for (int i = 0; i < 4; ++i) r |= (uint)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
}

inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __expf(float x) { return std::exp(x); }  // the device's is within a few ulp of these
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }  // the device's is within 2 ulp of this
inline uint __umulhi(uint a, uint b) { return (uint)(((uint64_t)a * (uint64_t)b) >> 32); }
inline int __clz(int x) { return std::countl_zero((uint32_t)x); }  // 32 for 0, as the device's

using std::max;
using std::min;
inline int64_t min(int64_t a, int b) { return a < b ? a : (int64_t)b; }
inline int64_t min(int a, int64_t b) { return a < b ? (int64_t)a : b; }
inline int64_t max(int64_t a, int b) { return a > b ? a : (int64_t)b; }
inline int64_t max(int a, int64_t b) { return a > b ? (int64_t)a : b; }

// the CTA the calling thread runs in: its barrier and shuffle buffer
struct Cta {
  std::barrier<> bar;
  std::vector<uint64_t> slots;
  explicit Cta(int n) : bar(n), slots(n) {}
};
inline thread_local Cta* cta_ = nullptr;

// the CTA's dynamic shared memory (``extern __shared__ ... buf_dyn_shmem[]`` is rewritten to point here)
alignas(1024) inline unsigned char mate_dyn_smem[1 << 18];
#define __syncthreads() cta_->bar.arrive_and_wait()
// every thread of the CTA reaches a __syncwarp (the kernels call it outside lane-dependent branches): the CTA's barrier
// orders at least what the warp's would
#define __syncwarp(...) cta_->bar.arrive_and_wait()

// a shuffle: every thread of the CTA publishes its value, then reads the one of lane ``src(lane)`` of its
// ``width``-lane segment (a source outside the segment reads the thread's own value, as on the GPU)
template <typename T, typename Src>
T shuffle_(T v, int width, Src src) {
  static_assert(sizeof(T) <= 8, "shuffle of a value of at most 8 bytes");
  int t = threadIdx.x;
  uint64_t w = 0;
  std::memcpy(&w, &v, sizeof(T));
  cta_->slots[t] = w;
  cta_->bar.arrive_and_wait();
  int lane = t % width;
  int s = src(lane);
  uint64_t r = cta_->slots[(s >= 0 && s < width) ? t - lane + s : t];
  cta_->bar.arrive_and_wait();
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}

template <typename T>
T __shfl_xor_sync(uint, T v, int lane_mask, int width) {
  return shuffle_(v, width, [&](int lane) { return (lane ^ lane_mask) % width; });
}

template <typename T>
T __shfl_up_sync(uint, T v, unsigned delta, int width) {
  return shuffle_(v, width, [&](int lane) { return lane - (int)delta; });
}

template <typename T>
T __shfl_sync(uint, T v, int src_lane, int width) {
  return shuffle_(v, width, [&](int) { return src_lane % width; });
}

// cp.async (16, 8 or 4 bytes, global -> shared) as a plain copy: the data is there at once, so commit and wait do
// nothing; a false condition zero-fills (src-size 0: nothing is read). The source must be aligned as on the device.
namespace tl {
template <int N>
void cp_async_gs(void* smem, const void* global) {
  vec<char[N]>((const char*)global);
  std::memcpy(smem, global, N);
}
template <int N>
void cp_async_gs_conditional(void* smem, const void* global, bool cond) {
  if (cond)
    cp_async_gs<N>(smem, global);
  else
    std::memset(smem, 0, N);
}
inline void cp_async_commit() {}
// the explicit 16- / 8-byte global stores (st.global.v4 / v2; aligned as on the device)
inline void store_global_128(void* p, uint4 v) { *vec<uint4>((uint4*)p) = v; }
inline void store_global_64(void* p, uint2 v) { *vec<uint2>((uint2*)p) = v; }
template <int N>
void cp_async_wait() {}
}  // namespace tl

// programmatic dependent launch: the kernels of a launch sequence run one after another here, so a dependent
// kernel's wait and its primary's trigger have nothing to order
inline void cudaTriggerProgrammaticLaunchCompletion() {}
inline void cudaGridDependencySynchronize() {}

// TileLang's scalar atomics (tl_templates/cuda/atomic.h's names; the memory order is the device's business: every
// one is sequentially consistent here) and __threadfence. The CTAs run one after another, which is one valid
// schedule of a kernel whose CTAs hand work over through counters (the last one to arrive does the rest).
template <typename T1, typename T2>
T1 AtomicAddRet(T1* address, T2 val, int = 0) {
  return std::atomic_ref<T1>(*address).fetch_add((T1)val);
}
template <typename T1, typename T2>
void AtomicAdd(T1* address, T2 val, int = 0) {
  std::atomic_ref<T1>(*address).fetch_add((T1)val);
}
template <typename T>
T AtomicLoad(T* ref, int) {
  return std::atomic_ref<T>(*ref).load();
}
template <typename T1, typename T2>
void AtomicStore(T1* ref, T2 value, int) {
  std::atomic_ref<T1>(*ref).store((T1)value);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// run ``kernel()`` over a grid: ``threads`` std::threads per CTA, the CTAs one after another (each thread walks
// every CTA; a barrier separates them, so a CTA's writes are done before the next one starts)
template <typename F>
void emulate_grid(int gx, int gy, int gz, int threads, F kernel) {
  Cta cta(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      cta_ = &cta;
      threadIdx = Dim3{t, 0, 0};
      for (int z = 0; z < gz; ++z)
        for (int y = 0; y < gy; ++y)
          for (int x = 0; x < gx; ++x) {
            blockIdx = Dim3{x, y, z};
            kernel();
            cta.bar.arrive_and_wait();
          }
    });
  }
  for (auto& th : pool) th.join();
}
