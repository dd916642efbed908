// Host time of one kernel launch on this machine, by API and parameter size: the floor under
// the host time of an eager decode call (docs/performance.md). Not part of the library:
// `tools/gpu/verify.sh stage` builds it into .gpu/ and the verify script's bench stage runs it.
// By hand:
//   nvcc -O2 -std=c++17 -arch=sm_90a -cudart static -o launch_cost tools/gpu/launch_cost.cu \
//        -L/usr/local/cuda/lib64/stubs -lcuda
//   ./launch_cost            # prints one line per variant, microseconds per call
//
// Each variant is timed two ways, as lockstep-bench times a decode call's host side:
//   busy: calls enqueued back to back while a spinning kernel keeps the device busy, so that
//         launches queue (a decode loop that runs ahead of the device);
//   idle: calls enqueued back to back on an idle device (each launch may start at once).
// The figure is the median over 7 batches of the batch's mean (200 calls per batch).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

struct Small {
  int* p;
};
// About the size of lockstep's DecodeParams (kernels/decode.hpp): 128 inline ints and pointers.
struct Big {
  int* p;
  int count;
  int v[128];
  long long w[26];
};

__global__ void k_small(Small s) {
  if (s.p != nullptr && threadIdx.x == 0) s.p[blockIdx.x] += 1;
}
__global__ void k_big(Big b) {
  if (b.p != nullptr && threadIdx.x == 0) b.p[blockIdx.x] += b.v[blockIdx.x % 128] + b.count;
}
// As lockstep's decode kernels begin (Note [overlapped launches]).
__global__ void k_pdl(Big b) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (b.p != nullptr && threadIdx.x == 0) b.p[blockIdx.x] += b.v[blockIdx.x % 128] + b.count;
}
__global__ void spin(long long ns) {
  long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > ns) break;
  }
}

using clk = std::chrono::steady_clock;

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main() {
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* buf;
  CK(cudaMalloc(&buf, 1 << 20));
  CK(cudaMemset(buf, 0, 1 << 20));
  Small sm{buf};
  Big big{};
  big.p = buf;
  big.count = 1;
  const dim3 grid(128), block(128);

  cudaLaunchAttribute pdl[1];
  pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = s;
  cfg.attrs = pdl;
  cfg.numAttrs = 1;

  // Driver API: the same kernel's CUfunction.
  cudaFunction_t rf;
  CK(cudaGetFuncBySymbol(&rf, reinterpret_cast<const void*>(k_pdl)));
  CUfunction cf = reinterpret_cast<CUfunction>(rf);
  CUlaunchAttribute dattr[1];
  dattr[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  dattr[0].value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig dcfg{};
  dcfg.gridDimX = grid.x;
  dcfg.gridDimY = dcfg.gridDimZ = 1;
  dcfg.blockDimX = block.x;
  dcfg.blockDimY = dcfg.blockDimZ = 1;
  dcfg.hStream = reinterpret_cast<CUstream>(s);
  dcfg.attrs = dattr;
  dcfg.numAttrs = 1;

  // The driver's launch as lockstep makes it since Note [driver launches]: through the runtime's
  // entry point (nothing links libcuda).
  using LaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
  void* lp = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CK(cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &lp, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess) std::exit(4);
  const LaunchEx launch_ex = reinterpret_cast<LaunchEx>(lp);

  // A graph of two PDL launches (a chunk kernel and a merge), captured once.
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  {
    void* args[] = {&big};
    CK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k_pdl), args));
    CK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k_pdl), args));
  }
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  size_t nn = 0;
  CK(cudaGraphGetNodes(g, nullptr, &nn));
  std::vector<cudaGraphNode_t> nodes(nn);
  CK(cudaGraphGetNodes(g, nodes.data(), &nn));
  std::vector<cudaKernelNodeParams> kp;
  for (auto n : nodes) {
    cudaGraphNodeType t;
    CK(cudaGraphNodeGetType(n, &t));
    if (t == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams p;
      CK(cudaGraphKernelNodeGetParams(n, &p));
      kp.push_back(p);
    }
  }
  std::printf("graph: %zu nodes, %zu kernel nodes\n", nn, kp.size());

  struct V {
    const char* name;
    std::function<void()> fn;
  };
  int tick = 0;
  std::vector<V> vs = {
      {"cudaLaunchKernel, 8-byte params", [&] {
         void* a[] = {&sm};
         CK(cudaLaunchKernel(reinterpret_cast<const void*>(k_small), grid, block, a, 0, s));
       }},
      {"cudaLaunchKernel, 744-byte params", [&] {
         void* a[] = {&big};
         CK(cudaLaunchKernel(reinterpret_cast<const void*>(k_big), grid, block, a, 0, s));
       }},
      {"cudaLaunchKernelExC + PDL, 744 B", [&] {
         void* a[] = {&big};
         CK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k_pdl), a));
       }},
      {"lockstep's wrapper: SetDevice + ExC + PDL + GetLastError", [&] {
         CK(cudaSetDevice(0));
         void* a[] = {&big};
         CK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k_pdl), a));
         CK(cudaGetLastError());
       }},
      {"cuLaunchKernelEx (driver) + PDL, 744 B", [&] {
         void* a[] = {&big};
         if (cuLaunchKernelEx(&dcfg, cf, a, nullptr) != CUDA_SUCCESS) std::exit(2);
       }},
      {"lockstep's driver wrapper: SetDevice + entry point's cuLaunchKernelEx + PDL", [&] {
         CK(cudaSetDevice(0));
         void* a[] = {&big};
         if (launch_ex(&dcfg, cf, a, nullptr) != CUDA_SUCCESS) std::exit(2);
       }},
      {"two launches: the driver wrapper x2", [&] {
         void* a[] = {&big};
         for (int i = 0; i < 2; ++i) {
           CK(cudaSetDevice(0));
           if (launch_ex(&dcfg, cf, a, nullptr) != CUDA_SUCCESS) std::exit(2);
         }
       }},
      {"two launches: ExC + PDL x2", [&] {
         void* a[] = {&big};
         CK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k_pdl), a));
         CK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k_pdl), a));
       }},
      {"cudaGraphLaunch (2 PDL nodes)", [&] { CK(cudaGraphLaunch(ge, s)); }},
      {"2x cudaGraphExecKernelNodeSetParams + cudaGraphLaunch", [&] {
         big.count = ++tick & 7;
         for (std::size_t i = 0; i < kp.size(); ++i) {
           void* a[] = {&big};
           kp[i].kernelParams = a;
           CK(cudaGraphExecKernelNodeSetParams(ge, nodes[i], &kp[i]));
         }
         CK(cudaGraphLaunch(ge, s));
       }},
      {"cudaSetDevice(0) alone", [&] { CK(cudaSetDevice(0)); }},
      {"cudaGetLastError alone", [&] { CK(cudaGetLastError()); }},
      {"cudaGetDevice alone", [&] {
         int d;
         CK(cudaGetDevice(&d));
       }},
      {"cudaStreamIsCapturing alone", [&] {
         cudaStreamCaptureStatus st;
         CK(cudaStreamIsCapturing(s, &st));
       }},
  };
  const int reps = 200, batches = 7;
  // Warm every path.
  for (auto& v : vs)
    for (int i = 0; i < 20; ++i) v.fn();
  CK(cudaStreamSynchronize(s));
  std::printf("%-58s %10s %10s\n", "variant", "busy us", "idle us");
  for (auto& v : vs) {
    double r[2];
    for (int mode = 0; mode < 2; ++mode) {
      std::vector<double> b;
      for (int k = 0; k < batches; ++k) {
        if (mode == 0) spin<<<1, 1, 0, s>>>(3'000'000);  // 3 ms: every batch's launches queue
        const auto t0 = clk::now();
        for (int i = 0; i < reps; ++i) v.fn();
        b.push_back(std::chrono::duration<double, std::micro>(clk::now() - t0).count() / reps);
        CK(cudaStreamSynchronize(s));
      }
      r[mode] = median(b);
    }
    std::printf("%-58s %10.2f %10.2f\n", v.name, r[0], r[1]);
  }
  return 0;
}
