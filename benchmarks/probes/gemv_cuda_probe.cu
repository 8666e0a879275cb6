// Diagnostics: how fast can a hand-written CUDA C++ kernel stream RMSNorm + Linear
// (rms_norm(X[m,4096]) @ W[4096,6144], fp16, m = 1, 8, 16) on this GPU? Times, side by side:
// - gemv: W goes from global memory straight into tensor-core operand registers (16-byte
//   loads, U steps in flight per warp, no shared memory); each warp takes a slice of K and the
//   warps' partial products meet in shared memory; mode=2 does the same loads without the
//   arithmetic (the ceiling of that tiling);
// - gemv_splitk: K split over S blocks per column tile so that every SM streams;
// - flat_read: every SM streams W's 50 MB with 16-byte loads (the read ceiling of the device).
//
//   nvcc -O3 -gencode=arch=compute_90,code=sm_90 -o /tmp/gemv benchmarks/probes/gemv_cuda_probe.cu
//   /tmp/gemv
//
// CUDA-graph replay medians (20 launches per graph, 50 replays) as in the benchmark report;
// results are checked against a float64 reference on a sample of columns.
#include <cuda_fp16.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

template <int HINT>
__device__ __forceinline__ void ldw(uint32_t* r, const void* p, int vec) {
  if (vec == 8) {
    if (HINT)
      asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
    else
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1]) : "l"(p));
  }
}

__device__ __forceinline__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float sq2(uint32_t v) {
  float2 f = __half22float2(*reinterpret_cast<__half2*>(&v));
  return f.x * f.x + f.y * f.y;
}

// One warp's stream over `steps` 16-row steps of W from row kbeg: VEC halves per thread and
// W row (8: 16-byte loads, 64 columns per block; 4: 8-byte, 32). Thread (g = lane/4,
// q = lane%4) loads rows k+2q, k+2q+1, k+2q+8, k+2q+9 at columns col0 + g*VEC .. +VEC-1;
// n-tile j's fragment column g is global column col0 + g*VEC + j. Leaves the warp's partial
// products in acc and the sums of squares of X rows g and g+8 over the slice in ss0, ss1
// (mode 0), or only reads W (mode 2; xorsum keeps the loads alive). U steps are in flight;
// PF=1 issues step s+U before waiting on step s (one more register slot). steps % (U+PF) == 0.
template <int U, int VEC, int MODE, int HINT, int PF>
__device__ __forceinline__ void stream_slice(const __half* __restrict__ X,
                                             const __half* __restrict__ W, int M, int K, int N,
                                             int col0, int kbeg, int steps, float (&acc)[VEC][4],
                                             float& ss0, float& ss1, uint32_t& xorsum) {
  const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const __half* wp = W + (size_t)(kbeg + 2 * q) * N + col0 + g * VEC;
  const size_t rowoff[4] = {0, (size_t)N, (size_t)8 * N, (size_t)9 * N};
  const bool v0 = g < M, v1 = g + 8 < M;
  const __half* xp0 = X + (size_t)g * K + kbeg + 2 * q;
  const __half* xp1 = X + (size_t)(g + 8) * K + kbeg + 2 * q;
#pragma unroll
  for (int j = 0; j < VEC; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  ss0 = ss1 = 0.f;
  xorsum = 0;
  constexpr int R = U + PF;  // register slots
  uint32_t wr[R][4][VEC / 2];
  uint32_t xr[R][4];

  auto load = [&](int s, int slot) {
    const __half* p = wp + (size_t)s * 16 * N;
#pragma unroll
    for (int r = 0; r < 4; r++) ldw<HINT>(wr[slot][r], p + rowoff[r], VEC);
    if (MODE == 0) {
      const int ko = s * 16;
      xr[slot][0] = v0 ? *reinterpret_cast<const uint32_t*>(xp0 + ko) : 0u;
      xr[slot][1] = v1 ? *reinterpret_cast<const uint32_t*>(xp1 + ko) : 0u;
      xr[slot][2] = v0 ? *reinterpret_cast<const uint32_t*>(xp0 + ko + 8) : 0u;
      xr[slot][3] = v1 ? *reinterpret_cast<const uint32_t*>(xp1 + ko + 8) : 0u;
    }
  };
  auto compute = [&](int slot) {
    if (MODE == 2) {
#pragma unroll
      for (int r = 0; r < 4; r++)
#pragma unroll
        for (int v = 0; v < VEC / 2; v++) xorsum ^= wr[slot][r][v];
      return;
    }
    ss0 += sq2(xr[slot][0]) + sq2(xr[slot][2]);
    ss1 += sq2(xr[slot][1]) + sq2(xr[slot][3]);
#pragma unroll
    for (int j = 0; j < VEC; j++) {
      const uint32_t sel = (j & 1) ? 0x7632u : 0x5410u;
      const uint32_t b0 = __byte_perm(wr[slot][0][j >> 1], wr[slot][1][j >> 1], sel);
      const uint32_t b1 = __byte_perm(wr[slot][2][j >> 1], wr[slot][3][j >> 1], sel);
      mma(acc[j], xr[slot], b0, b1);
    }
  };

#pragma unroll
  for (int u = 0; u < U; u++) load(u, u);
  for (int s0 = 0; s0 < steps; s0 += R) {
#pragma unroll
    for (int u = 0; u < R; u++) {
      if (PF) {
        if (s0 + u + U < steps) load(s0 + u + U, (u + U) % R);
        compute(u);
      } else {
        compute(u);
        if (s0 + U + u < steps) load(s0 + U + u, u);
      }
    }
  }
}

// Each warp's partials into red[warp] (row-major [16][BN]) and its sums of squares into
// ssr[warp]; the caller syncs and sums over warps (shared-memory float atomics are CAS loops).
template <int NW, int VEC>
__device__ __forceinline__ void partials_to_smem(const float (&acc)[VEC][4], float ss0, float ss1,
                                                 float (&red)[NW][8 * VEC * 16],
                                                 float (&ssr)[NW][16]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  ss0 += __shfl_xor_sync(0xffffffffu, ss0, 1);
  ss0 += __shfl_xor_sync(0xffffffffu, ss0, 2);
  ss1 += __shfl_xor_sync(0xffffffffu, ss1, 1);
  ss1 += __shfl_xor_sync(0xffffffffu, ss1, 2);
  if (q == 0) {
    ssr[warp][g] = ss0;
    ssr[warp][g + 8] = ss1;
  }
#pragma unroll
  for (int j = 0; j < VEC; j++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      red[warp][(g + (e >= 2 ? 8 : 0)) * 8 * VEC + (2 * q + (e & 1)) * VEC + j] = acc[j][e];
}

// One block per column tile, its NW warps splitting K.
template <int NW, int U, int VEC, int MODE, int HINT, int PF>
__global__ void __launch_bounds__(NW * 32, 1)
    gemv(const __half* __restrict__ X, const __half* __restrict__ W, __half* __restrict__ Y,
         int M, int K, int N, float eps) {
  constexpr int BN = 8 * VEC;
  __shared__ float red[NW][BN * 16];
  __shared__ float ssr[NW][16];
  const int warp = threadIdx.x >> 5, col0 = blockIdx.x * BN, kper = K / NW;
  float acc[VEC][4], ss0, ss1;
  uint32_t xorsum;
  stream_slice<U, VEC, MODE, HINT, PF>(X, W, M, K, N, col0, warp * kper, kper / 16, acc, ss0,
                                       ss1, xorsum);
  if (MODE == 2) {
    if (xorsum == 0x12345678u) Y[0] = __float2half(1.f);
    return;
  }
  partials_to_smem<NW, VEC>(acc, ss0, ss1, red, ssr);
  __syncthreads();
  for (int i = threadIdx.x; i < BN * M; i += blockDim.x) {
    const int row = i / BN;
    float a = 0.f, ss = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) {
      a += red[w][i];
      ss += ssr[w][row];
    }
    Y[(size_t)row * N + col0 + i % BN] = __float2half(a * rsqrtf(ss / K + eps));
  }
}

// Split K over S blocks per column tile so that every SM streams: each block reduces its
// warps' partials in shared memory, adds them to an fp32 workspace (red.global.add), and the
// last block of a tile (a per-tile counter) applies the norm, writes Y and clears the
// workspace and the counter for the next launch.
template <int NW, int U, int S>
__global__ void __launch_bounds__(NW * 32)
    gemv_splitk(const __half* __restrict__ X, const __half* __restrict__ W, __half* __restrict__ Y,
                float* __restrict__ ws, float* __restrict__ wss, unsigned* __restrict__ cnt,
                int M, int K, int N, float eps) {
  constexpr int VEC = 8, BN = 64;
  __shared__ float red[NW][BN * 16];
  __shared__ float ssr[NW][16];
  __shared__ bool last;
  const int warp = threadIdx.x >> 5, tile = blockIdx.x, col0 = tile * BN;
  const int kper = K / (NW * S);
  float acc[VEC][4], ss0, ss1;
  uint32_t xorsum;
  stream_slice<U, VEC, 0, 0, 0>(X, W, M, K, N, col0, (blockIdx.y * NW + warp) * kper, kper / 16,
                                acc, ss0, ss1, xorsum);
  partials_to_smem<NW, VEC>(acc, ss0, ss1, red, ssr);
  __syncthreads();
  for (int i = threadIdx.x; i < BN * M; i += blockDim.x) {
    float a = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) a += red[w][i];
    atomicAdd(&ws[(size_t)tile * BN * 16 + i], a);
  }
  if (threadIdx.x < M) {
    float ss = 0.f;
#pragma unroll
    for (int w = 0; w < NW; w++) ss += ssr[w][threadIdx.x];
    atomicAdd(&wss[tile * 16 + threadIdx.x], ss);
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&cnt[tile], 1u) == S - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int i = threadIdx.x; i < BN * M; i += blockDim.x) {
    const float a = __ldcg(&ws[(size_t)tile * BN * 16 + i]);
    const float ss = __ldcg(&wss[tile * 16 + i / BN]);
    Y[(size_t)(i / BN) * N + col0 + i % BN] = __float2half(a * rsqrtf(ss / K + eps));
    __stcg(&ws[(size_t)tile * BN * 16 + i], 0.f);
  }
  __syncthreads();
  if (threadIdx.x < 16) __stcg(&wss[tile * 16 + threadIdx.x], 0.f);
  if (threadIdx.x == 0) cnt[tile] = 0u;
}

// The read ceiling: every SM streams W with 16-byte loads, UNR loads in flight per thread.
template <int UNR>
__global__ void __launch_bounds__(512) flat_read(const uint4* __restrict__ W, size_t n, uint32_t* out) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  uint32_t x = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += UNR * stride) {
    uint32_t r[UNR][4];
#pragma unroll
    for (int u = 0; u < UNR; u++)
      if (i + u * stride < n) ldw<0>(r[u], W + i + u * stride, 8);
      else r[u][0] = r[u][1] = r[u][2] = r[u][3] = 0;
#pragma unroll
    for (int u = 0; u < UNR; u++) x ^= r[u][0] ^ r[u][1] ^ r[u][2] ^ r[u][3];
  }
  if (x == 0x12345678u) out[0] = x;
}

using Fn = void (*)(const __half*, const __half*, __half*, int, int, int, float);

struct Cfg {
  const char* name;
  Fn fn;
  int nw, vec;
};

#define C(NW, U, VEC, MODE, HINT, PF)                                                  \
  Cfg {                                                                                \
    "nw=" #NW " u=" #U " vec=" #VEC " mode=" #MODE " l2hint=" #HINT " pf=" #PF,        \
        gemv<NW, U, VEC, MODE, HINT, PF>, NW, VEC                                      \
  }

static float timed(const std::function<void(cudaStream_t)>& launch) {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  for (int i = 0; i < 3; i++) launch(s);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t gr;
  cudaGraphExec_t ge;
  const int launches = 20, replays = 50;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < launches; i++) launch(s);
  CK(cudaStreamEndCapture(s, &gr));
  CK(cudaGraphInstantiate(&ge, gr, 0));
  for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge, s));
  std::vector<cudaEvent_t> ev(2 * replays);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < replays; i++) {
    CK(cudaEventRecord(ev[2 * i], s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(ev[2 * i + 1], s));
  }
  CK(cudaStreamSynchronize(s));
  std::vector<float> t(replays);
  for (int i = 0; i < replays; i++) {
    CK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
    t[i] *= 1000.f / launches;
  }
  std::sort(t.begin(), t.end());
  for (auto& e : ev) cudaEventDestroy(e);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(gr);
  cudaStreamDestroy(s);
  return t[replays / 2];
}

struct SplitCfg {
  const char* name;
  void (*fn)(const __half*, const __half*, __half*, float*, float*, unsigned*, int, int, int, float);
  int nw, s;
};
#define SC(NW, U, S) SplitCfg{"splitk nw=" #NW " u=" #U " s=" #S, gemv_splitk<NW, U, S>, NW, S}

int main() {
  const int K = 4096, N = 6144, MM = 16;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("cuda gemv probe on %s (%d SMs, L2 %d MB)\n", prop.name, prop.multiProcessorCount,
         prop.l2CacheSize >> 20);
  std::mt19937 rng(0);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<__half> hx(MM * K), hw((size_t)K * N), hy(MM * N);
  for (auto& v : hx) v = __float2half(nd(rng));
  for (auto& v : hw) v = __float2half(nd(rng) / 64.f);
  __half *x, *w, *y;
  CK(cudaMalloc(&x, hx.size() * 2));
  CK(cudaMalloc(&w, hw.size() * 2));
  CK(cudaMalloc(&y, hy.size() * 2));
  CK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  // float64 reference on a sample of columns
  std::vector<int> cols;
  for (int c = 0; c < N; c += 61) cols.push_back(c);
  cols.push_back(N - 1);
  std::vector<double> rinv(MM);
  for (int r = 0; r < MM; r++) {
    double s = 0;
    for (int k = 0; k < K; k++) s += (double)__half2float(hx[r * K + k]) * __half2float(hx[r * K + k]);
    rinv[r] = 1.0 / std::sqrt(s / K + 1e-6);
  }
  std::vector<double> ref(MM * cols.size());
  for (int r = 0; r < MM; r++)
    for (size_t ci = 0; ci < cols.size(); ci++) {
      double s = 0;
      for (int k = 0; k < K; k++)
        s += (double)__half2float(hx[r * K + k]) * __half2float(hw[(size_t)k * N + cols[ci]]);
      ref[r * cols.size() + ci] = s * rinv[r];
    }
  std::vector<Cfg> cfgs = {
      C(8, 4, 8, 0, 0, 0), C(8, 3, 8, 0, 0, 1), C(8, 7, 8, 0, 0, 1), C(4, 3, 8, 0, 0, 1),
      C(4, 7, 8, 0, 0, 1), C(8, 4, 8, 0, 1, 0), C(4, 8, 4, 0, 0, 0), C(4, 7, 4, 0, 0, 1),
      C(8, 4, 8, 2, 0, 0),
  };
  const double mb = (double)K * N * 2 / 1e6;
  std::vector<SplitCfg> scfgs = {SC(4, 4, 2), SC(2, 4, 4), SC(4, 4, 4), SC(2, 4, 8), SC(4, 2, 8),
                                 SC(8, 2, 4), SC(4, 8, 2)};
  float *ws, *wss;
  unsigned* cnt;
  CK(cudaMalloc(&ws, (size_t)N * 16 * 4));
  CK(cudaMalloc(&wss, (size_t)(N / 64) * 16 * 4));
  CK(cudaMalloc(&cnt, (size_t)(N / 64) * 4));
  CK(cudaMemset(ws, 0, (size_t)N * 16 * 4));
  CK(cudaMemset(wss, 0, (size_t)(N / 64) * 16 * 4));
  CK(cudaMemset(cnt, 0, (size_t)(N / 64) * 4));
  // one launch from a zeroed Y, then the relative error of its sampled columns (a split-K
  // launch leaves its workspace and counters cleared for the next one)
  auto checked = [&](const std::function<void(cudaStream_t)>& launch, int m) {
    CK(cudaMemset(y, 0, hy.size() * 2));
    launch(0);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hy.data(), y, hy.size() * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int r = 0; r < m; r++)
      for (size_t ci = 0; ci < cols.size(); ci++) {
        const double want = ref[r * cols.size() + ci];
        const double d = __half2float(hy[r * N + cols[ci]]) - want;
        num += d * d;
        den += want * want;
      }
    return std::sqrt(num / den);
  };
  for (int m : {1, 8, 16}) {
    printf("== m=%d (W %.1f MB)\n", m, mb);
    for (auto& c : cfgs) {
      dim3 grid(N / (8 * c.vec)), block(c.nw * 32);
      auto launch = [&](cudaStream_t st) { c.fn<<<grid, block, 0, st>>>(x, w, y, m, K, N, 1e-6f); };
      const double err = checked(launch, m);
      const float us = timed(launch);
      printf("  %-36s grid=%3d: %6.1f us  %.2f TB/s", c.name, N / (8 * c.vec), us, mb / us);
      if (strstr(c.name, "mode=2") != nullptr)
        printf("  (read only)\n");
      else
        printf("  rel err %.1e%s\n", err, err < 1e-2 ? "" : " WRONG");
    }
    for (auto& c : scfgs) {
      dim3 grid(N / 64, c.s), block(c.nw * 32);
      auto launch = [&](cudaStream_t st) {
        c.fn<<<grid, block, 0, st>>>(x, w, y, ws, wss, cnt, m, K, N, 1e-6f);
      };
      const double err = checked(launch, m);
      const float us = timed(launch);
      printf("  %-36s grid=%3dx%d: %6.1f us  %.2f TB/s  rel err %.1e%s\n", c.name, N / 64, c.s, us,
             mb / us, err, err < 1e-2 ? "" : " WRONG");
    }
  }
  for (int blocks : {132, 264, 528}) {
    const size_t n16 = (size_t)K * N / 8;
    auto l4 = [&](cudaStream_t st) { flat_read<4><<<blocks, 512, 0, st>>>((const uint4*)w, n16, (uint32_t*)ws); };
    auto l8 = [&](cudaStream_t st) { flat_read<8><<<blocks, 512, 0, st>>>((const uint4*)w, n16, (uint32_t*)ws); };
    const float u4 = timed(l4), u8 = timed(l8);
    printf("flat read %d x 512 threads: %5.1f us (4 in flight) %5.1f us (8 in flight), %.2f / %.2f TB/s\n",
           blocks, u4, u8, mb / u4, mb / u8);
  }
  return 0;
}
