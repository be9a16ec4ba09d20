// Parley's CPU kernels for the int8 streaming step (engine/inference.py; built by
// engine/cpu_kernels.py). One stream steps one frame at a time, so each product reads every
// weight once and a frame's ~300 small ops cost more than its arithmetic.
//
// parley::int8_linear: y = (x W^T) * scale (* row_gain) + bias, with W int8 [N, K] (one scale
// per output row) and x, y fp32. AVX2 widens 8 weights at a time to fp32 in registers and
// multiplies them with the fp32 activations. torch's _weight_int8pack_mm rounds the activations
// to bf16 and, without AVX-512, converts them in software: 1.7x slower on the STT model's
// products here, and 0.1 off the dequantized product where this kernel is 1e-5 off.
// parley::stack_step: the whole RecurrentStack step (engine/inference.py, stack_step) in one call.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <cmath>
#include <tuple>
#include <vector>
#include <torch/library.h>
#include <immintrin.h>

namespace {

constexpr int64_t kRows = 4;  // output rows per block: 4 accumulators in flight hide the FMA latency

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  return _mm_cvtss_f32(_mm_add_ss(sum, _mm_movehdup_ps(sum)));
}

inline __m256 load8(const int8_t* w) {  // 8 int8 weights -> 8 floats
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
}
inline __m256 load8(const float* w) { return _mm256_loadu_ps(w); }

// dots[r] = x . w[r * K ...] for R rows of weights (K a multiple of 8): int8 ones, widened in
// registers, or ones already widened to fp32 (several activation rows share one widening).
template <int R, typename Weight>
inline void dot_rows(const float* x, const Weight* w, int64_t K, float* dots) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 xk = _mm256_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(load8(w + r * K + k), xk, acc[r]);
  }
  for (int r = 0; r < R; ++r) dots[r] = horizontal_sum(acc[r]);
}

// Two activation rows at once: each widened weight vector loaded from L1 feeds two products.
template <int R>
inline void dot_float_pair(const float* x0, const float* x1, const float* w, int64_t K, float* dots0, float* dots1) {
  __m256 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 a = _mm256_loadu_ps(x0 + k), b = _mm256_loadu_ps(x1 + k);
    for (int r = 0; r < R; ++r) {
      const __m256 wk = _mm256_loadu_ps(w + r * K + k);
      acc0[r] = _mm256_fmadd_ps(wk, a, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(wk, b, acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    dots0[r] = horizontal_sum(acc0[r]);
    dots1[r] = horizontal_sum(acc1[r]);
  }
}

template <int R>
void rows_block(const float* x, const int8_t* w, const float* scale, const float* bias, const float* gain,
                float* y, int64_t M, int64_t N, int64_t K, int64_t n, float* widened) {
  float dots[R];
  if (M == 1) {
    dot_rows<R>(x, w + n * K, K, dots);
  } else {
    for (int64_t i = 0; i < R * K; i += 8) _mm256_storeu_ps(widened + i, load8(w + n * K + i));
  }
  const auto store = [&](int64_t m, const float* row_dots) {
    const float g = gain ? gain[m] : 1.0f;
    for (int r = 0; r < R; ++r) y[m * N + n + r] = row_dots[r] * scale[n + r] * g + bias[n + r];
  };
  if (M == 1) {
    store(0, dots);
    return;
  }
  float second[R];
  int64_t m = 0;
  for (; m + 1 < M; m += 2) {
    dot_float_pair<R>(x + m * K, x + (m + 1) * K, widened, K, dots, second);
    store(m, dots);
    store(m + 1, second);
  }
  if (m < M) {
    dot_rows<R>(x + m * K, widened, K, dots);
    store(m, dots);
  }
}

// y [M, N] = (x [M, K] W^T) * scale (* gain[m]) + bias, on raw buffers.
void product_rows(const float* x, int64_t M, int64_t K, const int8_t* w, int64_t N, const float* scale,
                  const float* bias, const float* gain, float* y) {
  const int64_t blocks = (N + kRows - 1) / kRows;
  // One thread below ~256k multiply-adds per task: a single stream's products stay on its core.
  const int64_t grain = std::max<int64_t>(1, (1 << 18) / std::max<int64_t>(1, M * K * kRows));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> widened(M > 1 ? kRows * K : 0);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n = b * kRows;
      if (n + kRows <= N) {
        rows_block<kRows>(x, w, scale, bias, gain, y, M, N, K, n, widened.data());
      } else {
        for (int64_t r = n; r < N; ++r) rows_block<1>(x, w, scale, bias, gain, y, M, N, K, r, widened.data());
      }
    }
  });
}

// A matrix as the products read it: int8 W [N, K], fp32 scale and bias [N].
struct Packed {
  const int8_t* weight;
  const float *scale, *bias;
  int64_t N, K;
};

Packed check_packed(const at::Tensor& weight, const at::Tensor& scale, const at::Tensor& bias) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kChar && weight.is_contiguous(),
              "int8_linear: weight must be contiguous int8 [N, K]");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK(K % 8 == 0, "int8_linear: K must be a multiple of 8, not ", K);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == N && scale.is_contiguous(),
              "int8_linear: scale must be fp32 [N]");
  TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.numel() == N && bias.is_contiguous(),
              "int8_linear: bias must be fp32 [N]");
  return {weight.data_ptr<int8_t>(), scale.data_ptr<float>(), bias.data_ptr<float>(), N, K};
}

at::Tensor float_rows(const at::Tensor& t, int64_t columns, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.size(1) == columns, what, " must be [rows, ", columns, "], not ", t.sizes());
  return t.to(at::kFloat).contiguous();
}

at::Tensor int8_linear(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& scale,
                       const at::Tensor& bias, const c10::optional<at::Tensor>& row_gain) {
  const Packed p = check_packed(weight, scale, bias);
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, "int8_linear: x must be fp32");
  const at::Tensor x = float_rows(x_in, p.K, "int8_linear: x");
  const int64_t M = x.size(0);
  at::Tensor gain;
  if (row_gain.has_value()) {
    gain = row_gain->contiguous();
    TORCH_CHECK(gain.scalar_type() == at::kFloat && gain.numel() == M,
                "int8_linear: row_gain must be fp32 with one value per row of x");
  }
  at::Tensor y = at::empty({M, p.N}, x.options());
  product_rows(x.data_ptr<float>(), M, p.K, p.weight, p.N, p.scale, p.bias,
               gain.defined() ? gain.data_ptr<float>() : nullptr, y.data_ptr<float>());
  return y;
}

// ---- the recurrent stack's frame step (engine/inference.py, block_step), int8 form ----------

// Elementwise math 8 lanes at a time (every width here is a multiple of 8: the products check it).
// exp by Cephes' expf: range reduction to [-ln2/2, ln2/2] and a degree-6 polynomial, relative
// error about 1e-7, as accurate as the products' fp32 and 5-20x faster than scalar libm calls.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i power = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(power));
}

// e^x - 1 without the cancellation of exp8(x) - 1 near 0: its Taylor series below |x| = 0.5
// (the RG-LRU's 1 - a^2 for decays a close to 1).
inline __m256 expm1_8(__m256 x) {
  __m256 series = _mm256_set1_ps(1.0f / 40320.0f);
  for (const float c : {1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f})
    series = _mm256_fmadd_ps(series, x, _mm256_set1_ps(c));
  series = _mm256_mul_ps(series, x);
  const __m256 small = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(0.5f), _CMP_LT_OQ);
  return _mm256_blendv_ps(_mm256_sub_ps(exp8(x), _mm256_set1_ps(1.0f)), series, small);
}

inline __m256 sigmoid8(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), v))));
}

// GELU's tanh form: 0.5 v (1 + tanh(u)) = v sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3)
inline __m256 gelu_tanh8(__m256 v) {
  const __m256 u = _mm256_mul_ps(v, _mm256_fmadd_ps(_mm256_mul_ps(v, v), _mm256_set1_ps(0.044715f),
                                                    _mm256_set1_ps(1.0f)));
  return _mm256_mul_ps(v, sigmoid8(_mm256_mul_ps(u, _mm256_set1_ps(2.0f * 0.7978845608028654f))));
}

// 1 / RMS of each row [M, C]
void rms_gains(const float* x, int64_t M, int64_t C, float eps, float* gains) {
  for (int64_t m = 0; m < M; ++m) {
    double sum = 0.0;
    for (int64_t c = 0; c < C; ++c) sum += static_cast<double>(x[m * C + c]) * x[m * C + c];
    gains[m] = 1.0f / std::sqrt(eps + static_cast<float>(sum / C));
  }
}

constexpr int kTensorsPerBlock = 20;  // BlockWeights' fields in order, each Packed as its three tensors

struct Block {
  Packed branches, gates, out, mlp_in, mlp_out;
  const float *conv_taps, *conv_bias, *log_decay_rate;
  float eps, min_norm;
  int64_t taps, expanded;
};

const float* float_vector(const at::Tensor& t, int64_t n, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.numel() == n,
              "stack_step: ", what, " must be contiguous fp32 with ", n, " values");
  return t.data_ptr<float>();
}

Block read_block(const std::vector<at::Tensor>& t, size_t i) {
  Block b;
  b.branches = check_packed(t[i], t[i + 1], t[i + 2]);
  TORCH_CHECK(t[i + 3].scalar_type() == at::kFloat && t[i + 3].is_contiguous() && t[i + 3].dim() == 2,
              "stack_step: conv taps must be contiguous fp32 [kernel, expanded]");
  b.conv_taps = t[i + 3].data_ptr<float>();
  b.taps = t[i + 3].size(0);
  b.expanded = t[i + 3].size(1);
  b.conv_bias = float_vector(t[i + 4], b.expanded, "conv bias");
  b.gates = check_packed(t[i + 5], t[i + 6], t[i + 7]);
  b.log_decay_rate = float_vector(t[i + 8], b.expanded, "log decay rate");
  b.out = check_packed(t[i + 9], t[i + 10], t[i + 11]);
  b.mlp_in = check_packed(t[i + 12], t[i + 13], t[i + 14]);
  b.mlp_out = check_packed(t[i + 15], t[i + 16], t[i + 17]);
  b.eps = t[i + 18].item<float>();
  b.min_norm = t[i + 19].item<float>();
  const int64_t E = b.expanded, W = b.branches.K;
  TORCH_CHECK(b.taps >= 2 && b.branches.N == 2 * E && b.gates.K == E && b.gates.N == 2 * E && b.out.K == E &&
              b.out.N == W && b.mlp_in.K == W && b.mlp_out.K * 2 == b.mlp_in.N && b.mlp_out.N == W,
              "stack_step: a block's weights do not fit together");
  return b;
}

// One block on rows x [M, W] (updated in place), conv state [M, taps - 1, E] and h [M, E] -> new states.
void block_step(const Block& b, float* x, int64_t M, const float* conv, const float* h, float* new_conv, float* new_h) {
  const int64_t W = b.branches.K, E = b.expanded, H = b.mlp_out.K, past = b.taps - 1;
  std::vector<float> gains(M), gate_branch(M * 2 * E), conv_out(M * E), gates(M * 2 * E), mixed(M * E),
      delta(M * W), mlp(M * 2 * H), mlp_mixed(M * H);
  rms_gains(x, M, W, b.eps, gains.data());
  product_rows(x, M, W, b.branches.weight, 2 * E, b.branches.scale, b.branches.bias, gains.data(), gate_branch.data());
  for (int64_t m = 0; m < M; ++m) {
    const float* branch = &gate_branch[m * 2 * E + E];
    const float* window = conv + m * past * E;  // the past frames' branch values, oldest first
    for (int64_t e = 0; e < E; e += 8) {
      __m256 sum = _mm256_fmadd_ps(_mm256_loadu_ps(branch + e), _mm256_loadu_ps(b.conv_taps + past * E + e),
                                   _mm256_loadu_ps(b.conv_bias + e));
      for (int64_t k = 0; k < past; ++k)
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(window + k * E + e), _mm256_loadu_ps(b.conv_taps + k * E + e), sum);
      _mm256_storeu_ps(&conv_out[m * E + e], sum);
    }
    float* shifted = new_conv + m * past * E;
    std::copy(window + E, window + past * E, shifted);
    std::copy(branch, branch + E, shifted + (past - 1) * E);
  }
  product_rows(conv_out.data(), M, E, b.gates.weight, 2 * E, b.gates.scale, b.gates.bias, nullptr, gates.data());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t e = 0; e < E; e += 8) {
      const int64_t i = m * E + e;
      const __m256 input_gate = sigmoid8(_mm256_loadu_ps(&gates[m * 2 * E + e]));
      const __m256 recurrence_gate = sigmoid8(_mm256_loadu_ps(&gates[m * 2 * E + E + e]));
      const __m256 log_decay = _mm256_mul_ps(_mm256_loadu_ps(b.log_decay_rate + e), recurrence_gate);
      // sqrt(1 - a^2) = sqrt(-expm1(2 log a)), as RGLRU computes it
      const __m256 norm = _mm256_sqrt_ps(_mm256_max_ps(
          _mm256_sub_ps(_mm256_setzero_ps(), expm1_8(_mm256_add_ps(log_decay, log_decay))), _mm256_set1_ps(b.min_norm)));
      const __m256 state = _mm256_fmadd_ps(exp8(log_decay), _mm256_loadu_ps(h + i),
                                           _mm256_mul_ps(_mm256_mul_ps(norm, input_gate), _mm256_loadu_ps(&conv_out[i])));
      _mm256_storeu_ps(new_h + i, state);
      _mm256_storeu_ps(&mixed[i], _mm256_mul_ps(gelu_tanh8(_mm256_loadu_ps(&gate_branch[m * 2 * E + e])), state));
    }
  }
  product_rows(mixed.data(), M, E, b.out.weight, W, b.out.scale, b.out.bias, nullptr, delta.data());
  for (int64_t i = 0; i < M * W; ++i) x[i] += delta[i];
  rms_gains(x, M, W, b.eps, gains.data());
  product_rows(x, M, W, b.mlp_in.weight, 2 * H, b.mlp_in.scale, b.mlp_in.bias, gains.data(), mlp.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < H; j += 8)
      _mm256_storeu_ps(&mlp_mixed[m * H + j], _mm256_mul_ps(gelu_tanh8(_mm256_loadu_ps(&mlp[m * 2 * H + j])),
                                                            _mm256_loadu_ps(&mlp[m * 2 * H + H + j])));
  product_rows(mlp_mixed.data(), M, H, b.mlp_out.weight, W, b.mlp_out.scale, b.mlp_out.bias, nullptr, delta.data());
  for (int64_t i = 0; i < M * W; ++i) x[i] += delta[i];
}

// RecurrentStack.step without its final norm, with int8 matrices and GELU's tanh form:
// x [M, W], per block conv [M, taps - 1, E] and h [M, E] -> (y, new convs, new hs).
std::tuple<at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>> stack_step(
    const at::Tensor& x_in, const std::vector<at::Tensor>& convs, const std::vector<at::Tensor>& hs,
    const std::vector<at::Tensor>& weights) {
  TORCH_CHECK(weights.size() % kTensorsPerBlock == 0 && weights.size() / kTensorsPerBlock == convs.size() &&
              convs.size() == hs.size(), "stack_step: one conv state, one h and ", kTensorsPerBlock,
              " weight tensors per block");
  TORCH_CHECK(x_in.dim() == 2, "stack_step: x must be [rows, width]");
  at::Tensor x = x_in.to(at::kFloat).clone(at::MemoryFormat::Contiguous);
  const int64_t M = x.size(0);
  std::vector<at::Tensor> new_convs, new_hs;
  for (size_t i = 0; i < convs.size(); ++i) {
    const Block b = read_block(weights, i * kTensorsPerBlock);
    TORCH_CHECK(x.size(1) == b.branches.K, "stack_step: x has ", x.size(1), " columns, the block reads ", b.branches.K);
    const at::Tensor conv = convs[i].to(at::kFloat).contiguous(), h = hs[i].to(at::kFloat).contiguous();
    TORCH_CHECK(conv.dim() == 3 && conv.size(0) == M && conv.size(1) == b.taps - 1 && conv.size(2) == b.expanded &&
                h.dim() == 2 && h.size(0) == M && h.size(1) == b.expanded, "stack_step: block ", i,
                "'s state does not fit x and its weights");
    at::Tensor new_conv = at::empty_like(conv), new_h = at::empty_like(h);
    block_step(b, x.data_ptr<float>(), M, conv.data_ptr<float>(), h.data_ptr<float>(),
               new_conv.data_ptr<float>(), new_h.data_ptr<float>());
    new_convs.push_back(new_conv);
    new_hs.push_back(new_h);
  }
  return {x, new_convs, new_hs};
}

}  // namespace

TORCH_LIBRARY(parley, m) {
  m.def("int8_linear(Tensor x, Tensor weight, Tensor scale, Tensor bias, Tensor? row_gain=None) -> Tensor",
        &int8_linear);
  m.def("stack_step(Tensor x, Tensor[] convs, Tensor[] hs, Tensor[] weights) -> (Tensor, Tensor[], Tensor[])",
        &stack_step);
}
