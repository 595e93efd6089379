/* test_passes.c — each graph pass on a small graph written in the text syntax: the graph before, the
 * nodes expected after. Every case is also a property test: random inputs through the graph before and
 * after give the same outputs, and optimising the result again changes nothing. */
#include "check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>

#define HEADER "<ir_version: 8, opset_import: [\"\" : 17]>\n"

/* Multi-head attention as exporters write it, over q [L,N,d], k [S,N,d], v [S,N,dv] and a scalar c. */
#define ATTENTION_BODY                             \
	"   qt = Transpose <perm = [1,0,2]> (q)\n" \
	"   qs = Div (qt, c)\n"                    \
	"   kt = Transpose <perm = [1,2,0]> (k)\n" \
	"   s = MatMul (qs, kt)\n"                 \
	"   p = Softmax <axis = -1> (s)\n"         \
	"   vt = Transpose <perm = [1,0,2]> (v)\n" \
	"   o = MatMul (p, vt)\n"                  \
	"   y = Transpose <perm = [1,0,2]> (o)\n"  \
	"}\n"

typedef struct pass_case {
	const char *what;
	const char *passes; /* comma-separated; NULL: the whole pipeline at `level` */
	int level;
	const char *before; /* a model */
	const char *after; /* the optimised graph's statements, one per line */
} pass_case;

static const pass_case cases[] = {
        {"fold-constants: Shape, Gather, Mul, Concat of a static shape fold into Reshape's shape", "fold-constants,dce",
         0,
         HEADER "g (float[2,3,4] x) => (float[6,4] y) {\n"
                "   s = Shape (x)\n"
                "   i0 = Constant <value = int64[1] {0}> ()\n"
                "   i1 = Constant <value = int64[1] {1}> ()\n"
                "   d0 = Gather <axis = 0> (s, i0)\n"
                "   d1 = Gather <axis = 0> (s, i1)\n"
                "   p = Mul (d0, d1)\n"
                "   m = Constant <value = int64[1] {-1}> ()\n"
                "   u = Unsqueeze (p, i0)\n"
                "   f = Flatten <axis = 0> (u)\n"
                "   q = Squeeze (f, i0)\n"
                "   shape = Concat <axis = 0> (q, m)\n"
                "   y = Reshape (x, shape)\n"
                "}\n",
         "y = Reshape (x, shape)\n"},
        {"fold-constants: a dynamic input keeps its shape arithmetic", "fold-constants", 0,
         HEADER "g (float[N,4] x) => (float[N,4] y) {\n"
                "   s = Shape (x)\n"
                "   y = Reshape (x, s)\n"
                "}\n",
         "s = Shape (x)\n"
         "y = Reshape (x, s)\n"},
        {"eliminate-noops: Identity, Dropout, same-shape Reshape, Cast, Transpose, Pad, Slice, Mul by one",
         "eliminate-noops,dce", 0,
         HEADER "g (float[2,3] x) => (float[2,3] y) <int64[2] shape = {2,3}, int64[4] zero = {0,0,0,0},\n"
                "   int64[1] s0 = {0}, int64[1] s1 = {3}, int64[1] ax = {1}, float one = {1}> {\n"
                "   a = Identity (x)\n"
                "   b = Dropout (a)\n"
                "   c = Reshape (b, shape)\n"
                "   d = Cast <to = 1> (c)\n"
                "   e = Transpose <perm = [0,1]> (d)\n"
                "   f = Pad (e, zero)\n"
                "   g = Slice (f, s0, s1, ax)\n"
                "   h = Mul (g, one)\n"
                "   y = Relu (h)\n"
                "}\n",
         "y = Relu (x)\n"},
        {"eliminate-noops: an Identity writing a graph output hands the name to its producer", "eliminate-noops", 0,
         HEADER "g (float[2,3] x) => (float[2,3] y) {\n"
                "   a = Relu (x)\n"
                "   y = Identity (a)\n"
                "}\n",
         "y = Relu (x)\n"},
        {"dce: dead nodes, unused optional outputs and initializers go", "dce", 0,
         HEADER "g (float[1,1,4,4] x) => (float[1,1,2,2] y) <float[2] unused = {1,2}> {\n"
                "   dead = Sigmoid (x)\n"
                "   deader = Relu (dead)\n"
                "   y, idx = MaxPool <kernel_shape = [2,2], strides = [2,2]> (x)\n"
                "}\n",
         "y = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (x)\n"},
        {"cse: repeated computations and equal initializers merge", "cse,dce", 0,
         HEADER "g (float[2,3] x) => (float[2,3] y) <float[3] b1 = {1,2,3}, float[3] b2 = {1,2,3}> {\n"
                "   a = Add (x, b1)\n"
                "   b = Add (x, b2)\n"
                "   ra = Relu (a)\n"
                "   rb = Relu (b)\n"
                "   y = Mul (ra, rb)\n"
                "}\n",
         "a = Add (x, b1)\n"
         "ra = Relu (a)\n"
         "y = Mul (ra, ra)\n"},
        {"fold-batchnorm: an inference BatchNormalization folds into the Conv", "fold-batchnorm,dce", 0,
         HEADER
         "g (float[1,2,3,3] x) => (float[1,2,3,3] y) <float[2,2,1,1] w = {1,2,3,4}, float[2] cb = {0.5,-1},\n"
         "   float[2] scale = {2,0.5}, float[2] bias = {1,-1}, float[2] mean = {0.25,1}, float[2] var = {4,0.25}> {\n"
         "   c = Conv (x, w, cb)\n"
         "   y = BatchNormalization <epsilon = 0.001> (c, scale, bias, mean, var)\n"
         "}\n",
         "y = Conv (x, c_W, c_B)\n"},
        {"matmul-add-to-gemm: a matrix product plus a row bias is a Gemm", "matmul-add-to-gemm", 0,
         HEADER "g (float[4,3] a, float[3,5] b, float[5] bias) => (float[4,5] y) {\n"
                "   p = MatMul (a, b)\n"
                "   y = Add (bias, p)\n"
                "}\n",
         "y = Gemm (a, b, bias)\n"},
        {"matmul-add-to-gemm: a batched product stays a MatMul", "matmul-add-to-gemm", 0,
         HEADER "g (float[2,4,3] a, float[3,5] b, float[5] bias) => (float[2,4,5] y) {\n"
                "   p = MatMul (a, b)\n"
                "   y = Add (p, bias)\n"
                "}\n",
         "p = MatMul (a, b)\n"
         "y = Add (p, bias)\n"},
        {"simplify-reshapes: a Transpose of size-1 dimensions is a Reshape, merged with the Squeeze after it",
         "simplify-reshapes,dce", 0,
         HEADER "g (float[1,3,1,4] x) => (float[3,4] y) <int64[2] axes = {0,1}> {\n"
                "   t = Transpose <perm = [2,0,1,3]> (x)\n"
                "   y = Squeeze (t, axes)\n"
                "}\n",
         "y = Reshape (x, y_shape)\n"},
        {"simplify-reshapes: consecutive Transposes compose", "simplify-reshapes", 0,
         HEADER "g (float[2,3,4] x) => (float[4,2,3] y) {\n"
                "   t = Transpose <perm = [1,0,2]> (x)\n"
                "   y = Transpose <perm = [2,1,0]> (t)\n"
                "}\n",
         "y = Transpose <perm = [2, 0, 1]> (x)\n"},
        {"slices-to-split: three Slices tiling the last axis are one Split", "slices-to-split,dce", 0,
         HEADER "g (float[2,6] x) => (float[2,2] q, float[2,1] k, float[2,3] v)\n"
                "   <int64[1] s0 = {0}, int64[1] s2 = {2}, int64[1] s3 = {3}, int64[1] end = {9223372036854775807},\n"
                "    int64[1] ax = {-1}> {\n"
                "   k = Slice (x, s2, s3, ax)\n"
                "   q = Slice (x, s0, s2, ax)\n"
                "   v = Slice (x, s3, end, ax)\n"
                "}\n",
         "q, k, v = Split <axis = 1> (x, x_split)\n"},
        {"fold-pad: zero padding joins the Conv and the AveragePool", "fold-pad", 0,
         HEADER "g (float[1,2,4,4] x, float[2,2,3,3] w) => (float[1,2,4,4] y, float[1,2,4,4] z)\n"
                "   <int64[8] pads = {0,0,1,1,0,0,1,1}> {\n"
                "   p = Pad (x, pads)\n"
                "   y = Conv (p, w)\n"
                "   q = Pad (x, pads)\n"
                "   z = AveragePool <kernel_shape = [3,3]> (q)\n"
                "}\n",
         "y = Conv <pads = [1, 1, 1, 1]> (x, w)\n"
         "z = AveragePool <kernel_shape = [3, 3], pads = [1, 1, 1, 1], count_include_pad = 1> (x)\n"},
        {"recognize-layernorm: mean, variance, normalise, scale and shift", "recognize-layernorm,dce", 0,
         HEADER "g (float[2,3,8] x) => (float[2,3,8] y) <float eps = {0.00001}, float two = {2},\n"
                "   float[8] gamma = {1,2,3,4,5,6,7,8}, float[8] beta = {0,1,0,1,0,1,0,1}> {\n"
                "   m = ReduceMean <axes = [-1]> (x)\n"
                "   d = Sub (x, m)\n"
                "   sq = Pow (d, two)\n"
                "   v = ReduceMean <axes = [-1]> (sq)\n"
                "   ve = Add (v, eps)\n"
                "   sd = Sqrt (ve)\n"
                "   n = Div (d, sd)\n"
                "   s = Mul (n, gamma)\n"
                "   y = Add (s, beta)\n"
                "}\n",
         "y = LayerNormalization <axis = -1, epsilon = 1e-05> (x, y_scale, y_bias)\n"},
        {"recognize-gelu: the erf form as PyTorch writes it", "recognize-gelu", 0,
         HEADER "g (float[2,5] x) => (float[2,5] y) <float r2 = {1.4142135}, float one = {1}, float half = {0.5}> {\n"
                "   d = Div (x, r2)\n"
                "   e = Erf (d)\n"
                "   a = Add (e, one)\n"
                "   m = Mul (x, a)\n"
                "   y = Mul (m, half)\n"
                "}\n",
         "y = tern.Gelu (x)\n"},
        {"recognize-gelu: the tanh form with the products the other way round", "recognize-gelu", 0,
         HEADER "g (float[2,5] x) => (float[2,5] y)\n"
                "   <float k = {0.044715}, float b = {0.7978845608}, float one = {1}, float half = {0.5}, float three "
                "= {3}> {\n"
                "   c = Pow (x, three)\n"
                "   kc = Mul (k, c)\n"
                "   s = Add (x, kc)\n"
                "   i = Mul (b, s)\n"
                "   t = Tanh (i)\n"
                "   a = Add (one, t)\n"
                "   h = Mul (half, x)\n"
                "   y = Mul (h, a)\n"
                "}\n",
         "y = tern.Gelu <approximate = \"tanh\"> (x)\n"},
        {"fuse-conv: bias Add, residual Add and Relu join the Conv", "fuse-conv,dce", 0,
         HEADER "g (float[1,2,4,4] x, float[2,2,3,3] w, float[1,2,4,4] r) => (float[1,2,4,4] y)\n"
                "   <float[2,1,1] b = {0.5,-0.5}> {\n"
                "   c = Conv <pads = [1,1,1,1]> (x, w)\n"
                "   cb = Add (c, b)\n"
                "   s = Add (r, cb)\n"
                "   y = Relu (s)\n"
                "}\n",
         "y = tern.FusedConv <pads = [1, 1, 1, 1], activation = \"Relu\"> (x, w, c_B, r)\n"},
        {"fuse-conv: x * Sigmoid(x) after a Conv is its Silu activation", "fuse-conv", 0,
         HEADER "g (float[1,2,4,4] x, float[2,2,1,1] w, float[2] b) => (float[1,2,4,4] y) {\n"
                "   c = Conv (x, w, b)\n"
                "   s = Sigmoid (c)\n"
                "   y = Mul (s, c)\n"
                "}\n",
         "y = tern.FusedConv <activation = \"Silu\"> (x, w, b)\n"},
        {"fuse-conv: Clip with constant bounds", "fuse-conv", 0,
         HEADER "g (float[1,2,4,4] x, float[2,2,1,1] w) => (float[1,2,4,4] y) <float lo = {0}, float hi = {6}> {\n"
                "   c = Conv (x, w)\n"
                "   y = Clip (c, lo, hi)\n"
                "}\n",
         "y = tern.FusedConv <activation = \"Clip\", activation_params = [0.0, 6.0]> (x, w)\n"},
        {"fuse-conv: an output of several blocks, residual and Silu, split between threads", "fuse-conv", 0,
         HEADER "g (float[1,3,64,64] x, float[4,3,3,3] w, float[4] b, float[1,4,64,64] r) => (float[1,4,64,64] y) {\n"
                "   c = Conv <pads = [1,1,1,1]> (x, w, b)\n"
                "   z = Add (c, r)\n"
                "   s = Sigmoid (z)\n"
                "   y = Mul (z, s)\n"
                "}\n",
         "y = tern.FusedConv <pads = [1, 1, 1, 1], activation = \"Silu\"> (x, w, b, r)\n"},
        {"fuse-matmul: a batched MatMul with its bias and LeakyRelu", "fuse-matmul", 0,
         HEADER "g (float[2,4,3] a, float[3,5] b, float[5] bias) => (float[2,4,5] y) {\n"
                "   p = MatMul (a, b)\n"
                "   s = Add (p, bias)\n"
                "   y = LeakyRelu <alpha = 0.2> (s)\n"
                "}\n",
         "y = tern.FusedMatMul <activation = \"LeakyRelu\", activation_params = [0.2]> (a, b, bias)\n"},
        {"fuse-matmul: Gemm with a following Tanh", "fuse-matmul", 0,
         HEADER "g (float[4,3] a, float[5,3] b, float[5] c) => (float[4,5] y) {\n"
                "   p = Gemm <transB = 1, alpha = 0.5> (a, b, c)\n"
                "   y = Tanh (p)\n"
                "}\n",
         "y = tern.FusedGemm <transB = 1, alpha = 0.5, activation = \"Tanh\"> (a, b, c)\n"},
        {"fuse-attention: heads transposed forward, scaled scores, Softmax, values, transposed back", "fuse-attention",
         0,
         HEADER
         "g (float[4,2,3] q, float[5,2,3] k, float[5,2,6] v) => (float[4,2,6] y) <float c = {2}> {\n" ATTENTION_BODY,
         "y = tern.Attention <scale = 0.5> (q, k, v)\n"},
        {"fuse-attention: sizes in blocks of 16 (the direct kernel), an odd number of blocks, rows left over",
         "fuse-attention", 0,
         HEADER "g (float[7,2,16] q, float[48,2,16] k, float[48,2,48] v) => (float[7,2,48] y) <float c = {4}> "
                "{\n" ATTENTION_BODY,
         "y = tern.Attention <scale = 0.25> (q, k, v)\n"},
        {"fuse-attention: rows, keys and value columns that are not multiples of the kernel's blocks", "fuse-attention",
         0,
         HEADER "g (float[7,3,5] q, float[37,3,5] k, float[37,3,19] v) => (float[7,3,19] y) <float c = {2}> "
                "{\n" ATTENTION_BODY,
         "y = tern.Attention <scale = 0.5> (q, k, v)\n"},
        {"fuse-skip-layernorm: the residual Add joins the LayerNormalization", "fuse-skip-layernorm", 0,
         HEADER "g (float[2,3,8] x, float[2,3,8] r, float[8] s, float[8] b) => (float[2,3,8] y, float[2,3,8] sum) {\n"
                "   sum = Add (x, r)\n"
                "   y = LayerNormalization <axis = -1> (sum, s, b)\n"
                "}\n",
         "y, sum = tern.SkipLayerNormalization <axis = -1> (x, r, s, b)\n"},
        {"fuse-skip-layernorm: without the sum as an output, over two trailing axes", "fuse-skip-layernorm", 0,
         HEADER "g (float[2,3,9] x, float[2,3,9] r, float[3,9] s) => (float[2,3,9] y) {\n"
                "   sum = Add (r, x)\n"
                "   y = LayerNormalization <axis = -2, epsilon = 0.001> (sum, s)\n"
                "}\n",
         "y = tern.SkipLayerNormalization <axis = -2, epsilon = 0.001> (r, x, s)\n"},
        {"fuse-skip-layernorm: enough rows for two threads", "fuse-skip-layernorm", 0,
         HEADER "g (float[96,128] x, float[96,128] r, float[128] s, float[128] b) => (float[96,128] y) {\n"
                "   sum = Add (x, r)\n"
                "   y = LayerNormalization <axis = -1> (sum, s, b)\n"
                "}\n",
         "y = tern.SkipLayerNormalization <axis = -1> (x, r, s, b)\n"},
        {"fuse-elementwise: Add, Relu, Mul by a per-channel constant, Sigmoid in one chain", "fuse-elementwise", 0,
         HEADER "g (float[1,3,2,2] x, float[1,3,2,2] z) => (float[1,3,2,2] y) <float[3,1,1] k = {1,2,3}> {\n"
                "   a = Add (x, z)\n"
                "   r = Relu (a)\n"
                "   m = Mul (k, r)\n"
                "   y = Sigmoid (m)\n"
                "}\n",
         "y = tern.ElementwiseChain <ops = [\"Add\", \"Relu\", \"Mul\", \"Sigmoid\"], args = [0, 1, -1, 3, -1, -1, 2, "
         "4, "
         "-1, 5, -1, -1], params = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]> (x, z, k)\n"},
        {"fold-scales: the 1/sqrt(d) of attention becomes the product's alpha", "fold-scales", 0,
         HEADER "g (float[4,8,16] q, float[4,16,8] k) => (float[4,8,8] y) <float c = {4}> {\n"
                "   s = Div (q, c)\n"
                "   y = MatMul (s, k)\n"
                "}\n",
         "y = tern.FusedMatMul <alpha = 0.25> (q, k)\n"},
        {"fold-scales then the direct FusedMatMul: constant weights, alpha, bias and Clip stored with the products",
         "fuse-matmul,fold-scales", 0,
         HEADER "g (float[3,7,6] x) => (float[3,7,20] y) <float c = {2}, float[6,20] w = "
                "{0.246,0.484,0.59,0.885,0.48,0.845,-0.942,-0.069,0.887,0.298,0.802,-0.774,-0.062,-0.507,0.088,0.148,-"
                "0.974,-0.567,-0.441,0.833,0.531,-0.681,0.594,-0.722,0.235,-0.747,-0.996,0.743,-0.581,-0.569,0.965,0."
                "745,-0.421,0.923,0.078,0.356,-0.59,0.882,0.381,0.933,0.787,-0.402,-0.278,-0.668,-0.709,-0.87,-0.397,0."
                "206,-0.993,0.356,-0.324,-0.38,0.637,-0.039,-0.368,-0.038,0.409,-0.886,0.95,-0.954,0.5,0.69,-0.964,0."
                "575,-0.268,0.157,-0.982,-0.907,-0.638,0.91,-0.607,0.511,0.859,0.884,-0.311,-0.29,0.049,0.551,-0.784,0."
                "497,0.594,0.719,-0.927,0.892,-0.818,-0.319,0.222,0.836,-0.32,0.848,0.09,-0.375,-0.366,-0.645,-0.844,-"
                "0.702,0.378,0.993,-0.677,-0.903,0.973,0.067,-0.188,-0.525,0.188,0.653,-0.089,-0.156,-0.889,0.832,-0."
                "935,-0.013,0.677,-0.739,0.463,0.9,0.261,0.576,-0.787,-0.131}, "
                "float[20] b = "
                "{-0.702,0.689,-0.41,-0.094,0.999,0.705,0.952,-0.093,-0.024,0.459,-0.042,-0.418,-0.192,-0.707,-0.246,0."
                "977,0.92,0.254,-0.001,-0.323}, float lo = {-0.5}, float hi = {0.75}> {\n"
                "   s = Div (x, c)\n"
                "   p = MatMul (s, w)\n"
                "   q = Add (p, b)\n"
                "   y = Clip (q, lo, hi)\n"
                "}\n",
         "y = tern.FusedMatMul <activation = \"Clip\", activation_params = [-0.5, 0.75], alpha = 0.5> (x, w, b)\n"},
        {"fold-embedding: an LSTM reads its input rows from a constant table", "fold-embedding", 0,
         HEADER
         "g (int64[5,1] tokens) => (float[5,1,1,3] y) <float[8,6] e = "
         "{-0.095,0.12,0.848,-0.069,0.016,0.175,-0.631,0.024,0.26,0.586,-0.812,-0.393,-0.819,0.619,0.387,-0.916,0.964,"
         "0.93,0.308,0.231,-0.685,-0.97,0.057,-0.881,-0.62,-0.516,-0.94,-0.072,-0.119,0.685,0.038,0.281,-0.0,0.325,-0."
         "085,-0.444,0.995,0.991,0.68,0.416,-0.369,-0.541,-0.422,-0.86,0.533,-0.199,0.693,-0.227}, float[1,12,6] w = "
         "{0.916,0.695,-0.999,-0.581,0.821,-0.06,0.961,-0.205,-0.854,0.259,0.557,-0.46,-0.826,-0.335,0.928,0.516,-0."
         "764,-0.507,-0.798,-0.88,0.594,-0.645,0.119,-0.105,-0.619,0.464,-0.738,0.287,-0.767,-0.158,-0.574,-0.46,0.942,"
         "0.607,-0.392,0.77,-0.579,-0.211,0.709,0.284,-0.799,0.979,-0.574,-0.483,0.545,-0.342,-0.407,-0.853,-0.82,0."
         "165,-0.514,0.203,-0.257,-0.094,0.918,-0.033,0.149,0.733,-0.634,-0.692,0.817,0.636,-0.501,-0.62,0.479,0.881,-"
         "0.607,0.9,0.764,0.207,-0.157,-0.792}, "
         "float[1,12,3] r = "
         "{-0.923,0.925,-0.523,0.409,-0.486,0.647,0.193,-0.413,-0.649,0.441,-0.862,-0.543,0.119,0.705,0.229,-0.44,0."
         "835,-0.592,-0.967,-0.462,-0.109,-0.879,-0.647,-0.262,0.144,-0.737,-0.276,0.782,0.961,0.314,0.382,0.169,-0."
         "719,-0.93,-0.964,0.82}, float[1,24] b = "
         "{0.402,0.926,-0.957,0.272,-0.036,0.461,-0.362,0.999,-0.849,0.092,0.474,0.8,0.474,0.407,0.587,0.83,-0.296,0."
         "37,0.802,0.742,-0.166,0.581,0.727,0.146}> {\n"
         "   x = Gather (e, tokens)\n"
         "   y = LSTM <hidden_size = 3> (x, w, r, b)\n"
         "}\n",
         "x_1 = Gather (e_1, tokens)\n"
         "y = tern.LSTM <hidden_size = 3, projected = 1> (x_1, , r)\n"},
        {"fold-embedding: a table narrower than the gates it would project stays a lookup (P would grow the weights)",
         "fold-embedding", 0,
         HEADER
         "g (int64[5,1] tokens) => (float[5,1,1,3] y) <float[8,2] e = "
         "{-0.095,0.120,0.848,-0.069,0.016,0.175,-0.631,0.024,0.260,0.586,-0.812,-0.393,-0.819,0.619,0.387,-0.916}, float[1,12,2] w = "
         "{0.964,0.930,0.308,0.231,-0.685,-0.970,0.057,-0.881,-0.620,-0.516,-0.940,-0.072,-0.119,0.685,0.038,"
         "0.281,-0.000,0.325,-0.085,-0.444,0.995,0.991,0.680,0.416}, float[1,12,3] r = "
         "{-0.369,-0.541,-0.422,-0.860,0.533,-0.199,0.693,-0.227,0.916,0.695,-0.999,-0.581,0.821,-0.060,0.961,"
         "-0.205,-0.854,0.259,0.557,-0.460,-0.826,-0.335,0.928,0.516,-0.764,-0.507,-0.798,-0.880,0.594,-0.645,"
         "0.119,-0.105,-0.619,0.464,-0.738,0.287}, float[1,24] b = "
         "{-0.767,-0.158,-0.574,-0.460,0.942,0.607,-0.392,0.770,-0.579,-0.211,0.709,0.284,-0.799,0.979,-0.574,"
         "-0.483,0.545,-0.342,-0.407,-0.853,-0.820,0.165,-0.514,0.203}> {\n"
         "   x = Gather (e, tokens)\n"
         "   y = LSTM <hidden_size = 3> (x, w, r, b)\n"
         "}\n",
         "x = Gather (e, tokens)\n"
         "y = LSTM <hidden_size = 3> (x, w, r, b)\n"},
        {"fold-embedding: a bidirectional GRU (linear_before_reset) behind a Transpose keeps its bias",
         "fold-embedding", 0,
         HEADER
         "g (int64[1,5] tokens) => (float[5,2,1,2] y) <float[8,8] e = "
         "{-0.352,-0.698,0.302,-0.855,0.072,-0.269,-0.884,0.015,-0.925,-0.133,-0.860,-0.819,-0.151,0.654,-0.752,"
         "-0.554,0.255,0.895,0.154,-0.207,0.953,-0.907,0.717,-0.421,-0.711,-0.764,-0.383,0.632,-0.639,0.163,0.278,"
         "-0.255,0.095,-0.874,-0.881,-0.588,0.361,-0.145,-0.372,0.171,-0.094,-0.400,0.589,0.398,-0.512,0.149,"
         "0.050,0.750,0.459,-0.424,0.960,-0.764,-0.164,0.514,-0.696,-0.022,-0.922,0.336,0.529,0.146,0.751,-0.373,"
         "0.391,0.189}, float[2,6,8] w = "
         "{0.160,-0.088,0.680,0.889,-0.052,0.328,-0.879,0.403,0.294,0.986,0.644,-0.431,-0.228,0.337,-0.955,-0.077,"
         "-0.664,-0.766,-0.882,0.536,-0.741,-0.505,-0.218,0.743,-0.839,-0.102,0.099,0.767,0.639,0.728,-0.443,"
         "-0.169,-0.282,0.768,0.915,-0.698,-0.648,-0.536,-0.533,-0.030,0.178,-0.475,-0.992,-0.162,-0.261,0.133,"
         "0.906,0.381,0.031,0.235,0.352,-0.892,0.799,0.560,0.749,0.596,-0.215,-0.202,-0.793,0.269,-0.876,-0.865,"
         "-0.582,-0.675,-0.320,-0.895,-1.000,-0.697,-0.797,-0.273,-0.949,0.749,0.228,-0.703,-0.495,-0.305,-0.272,"
         "-0.754,0.698,0.986,-0.068,-0.032,-0.828,-0.796,-0.315,-0.470,0.658,-0.677,-0.954,0.902,0.057,-0.707,"
         "0.086,-0.946,0.056,0.957}, "
         "float[2,6,2] r = "
         "{0.26,0.31,0.615,0.917,0.369,-0.601,-0.05,-0.643,-0.978,-0.056,0.428,-0.642,-0.455,-0.309,0.395,0.041,0.229,"
         "0.512,-0.213,0.584,0.812,-0.826,0.865,0.445}, float[2,12] b = "
         "{-0.74,-0.093,0.251,0.82,-0.246,0.138,0.759,0.594,0.889,-0.073,0.303,-0.59,0.444,0.637,0.283,0.435,-0.573,0."
         "8,0.961,0.955,0.074,0.582,-0.359,0.82}> {\n"
         "   x = Gather (e, tokens)\n"
         "   t = Transpose <perm = [1, 0, 2]> (x)\n"
         "   y = GRU <hidden_size = 2, direction = \"bidirectional\", linear_before_reset = 1> (t, w, r, b)\n"
         "}\n",
         "x_1 = Gather (e_1, tokens)\n"
         "t_1 = Transpose <perm = [1, 0, 2]> (x_1)\n"
         "y = tern.GRU <hidden_size = 2, direction = \"bidirectional\", linear_before_reset = 1, projected = 1> (t_1, "
         ", r, b)\n"},
        {"-O1 keeps standard operators: Conv and Relu stay apart", NULL, 1,
         HEADER "g (float[1,2,4,4] x, float[2,2,1,1] w) => (float[1,2,4,4] y) {\n"
                "   c = Conv (x, w)\n"
                "   i = Identity (c)\n"
                "   y = Relu (i)\n"
                "}\n",
         "c = Conv (x, w)\n"
         "y = Relu (c)\n"},
        {"-O2 runs the whole pipeline to a fixed point", NULL, 2,
         HEADER
         "g (float[1,2,4,4] x, float[2,2,1,1] w) => (float[1,32] y) <int64[2] shape = {1,-1}, int64[1] i = {1}> {\n"
         "   c = Conv (x, w)\n"
         "   d = Identity (c)\n"
         "   r = Relu (d)\n"
         "   s = Shape (r)\n"
         "   dead = Gather (s, i)\n"
         "   y = Reshape (r, shape)\n"
         "}\n",
         "r = tern.FusedConv <activation = \"Relu\"> (x, w)\n"
         "y = Reshape (r, shape)\n"},
};

/* ---------------------------------------------------------------- helpers */

static tern_model *load(const char *text)
{
	tern_model *m = NULL;
	CHECK_OK(tern_model_load_bytes(text, strlen(text), "case", NULL, &m));
	return m;
}

static void optimize(tern_model *m, const pass_case *pc, int *changes)
{
	char buf[256];
	const char *names[16];
	int n = 0;
	if (pc->passes) {
		snprintf(buf, sizeof buf, "%s", pc->passes);
		for (char *save = NULL, *p = strtok_r(buf, ",", &save); p && n < 16; p = strtok_r(NULL, ",", &save))
			names[n++] = p;
	}
	tern_optimize_options o = {pc->level, names, n, NULL, NULL, 0};
	tern_pass_stat *st = NULL;
	int n_st = 0;
	CHECK_OK(tern_optimize(m, &o, &st, &n_st));
	*changes = 0;
	for (int i = 0; i < n_st; i++)
		*changes += st[i].removed + st[i].added + st[i].fused + st[i].rewritten;
	free(st);
}

/* The statements between the graph's braces, each trimmed, one per line. */
static char *body(tern_model *m)
{
	char *text = NULL;
	size_t size;
	CHECK_OK(tern_model_save_text(m, 0, &text, &size));
	if (!text)
		return NULL;
	char *open = strstr(text, "{\n");
	char *out = calloc(strlen(text) + 1, 1);
	size_t k = 0;
	for (char *line = open ? open + 2 : text; line && *line && *line != '}';) {
		char *end = strchr(line, '\n');
		size_t len = end ? (size_t)(end - line) : strlen(line);
		size_t lead = strspn(line, " \t");
		memcpy(out + k, line + lead, len - lead);
		k += len - lead;
		out[k++] = '\n';
		line = end ? end + 1 : NULL;
	}
	free(text);
	return out;
}

/* Deterministic values in [-2, 2). */
/* Floats in [-2, 2); int64 (indices) in [0, 8). */
static void fill(tern_tensor *t, uint64_t *seed)
{
	for (int64_t i = 0, n = tern_tensor_numel(t); i < n; i++) {
		*seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
		if (t->dtype == TERN_INT64)
			((int64_t *)t->data)[i] = (int64_t)((*seed >> 40) % 8);
		else
			((float *)t->data)[i] = (float)((*seed >> 40) / (double)(1ull << 24) * 4.0 - 2.0);
	}
}

/* Runs a model on inputs from seed with n_threads; outputs copied into out (caller frees). */
static int run(tern_model *m, uint64_t seed, int n_threads, tern_tensor *out, int max_out)
{
	int n_in = tern_model_num_inputs(m);
	tern_tensor *in = calloc((size_t)n_in + 1, sizeof *in);
	for (int i = 0; i < n_in; i++) {
		int dtype, rank;
		int64_t dims[TERN_MAX_RANK];
		CHECK_OK(tern_model_input_type(m, i, &dtype, &rank, dims, NULL));
		for (int d = 0; d < rank; d++)
			dims[d] = dims[d] < 0 ? 3 : dims[d]; /* a symbolic dimension */
		CHECK_OK(tern_tensor_alloc(&in[i], dtype, rank, dims));
		fill(&in[i], &seed);
	}
	tern_plan *plan = NULL;
	tern_plan_options po = {.n_threads = n_threads};
	int n_out = 0;
	tern_status st = tern_plan_create(m, &po, in, n_in, &plan);
	CHECK_OK(st);
	if (!st) {
		CHECK_OK(tern_plan_run(plan, in, n_in));
		n_out = tern_plan_num_outputs(plan);
		for (int i = 0; i < n_out && i < max_out; i++)
			CHECK_OK(tern_tensor_copy(&out[i], tern_plan_output(plan, i)));
		tern_plan_free(plan);
	}
	for (int i = 0; i < n_in; i++)
		tern_tensor_free(&in[i]);
	free(in);
	return n_out < max_out ? n_out : max_out;
}

static bool close_outputs(const tern_tensor *a, const tern_tensor *b)
{
	if (a->dtype != b->dtype || a->rank != b->rank || memcmp(a->dims, b->dims, (size_t)a->rank * sizeof a->dims[0]))
		return false;
	double worst = 0, scale = 0;
	for (int64_t i = 0, n = tern_tensor_numel(a); i < n; i++) {
		double x = tern_tensor_get_f64(a, i), y = tern_tensor_get_f64(b, i);
		worst = fmax(worst, fabs(x - y));
		scale = fmax(scale, fabs(x));
	}
	return worst <= 1e-4 * scale + 1e-5;
}

static void test_case(const pass_case *pc)
{
	tern_model *before = load(pc->before), *after = load(pc->before);
	if (!before || !after) {
		fprintf(stderr, "case '%s' does not load\n", pc->what);
		tern_model_free(before);
		tern_model_free(after);
		return;
	}
	int changes;
	optimize(after, pc, &changes);
	char *got = body(after);
	bool same = got && strcmp(got, pc->after) == 0;
	CHECK(same);
	if (!same)
		fprintf(stderr, "case '%s':\n--- expected\n%s--- got\n%s", pc->what, pc->after, got ? got : "(none)\n");
	CHECK_OK(tern_model_validate(after));

	/* The same outputs on random inputs, the optimised graph also on two threads. */
	tern_tensor want[4] = {0}, have[4] = {0};
	for (uint64_t seed = 1; seed <= 3; seed++) {
		int nw = run(before, seed, 1, want, 4), nh = run(after, seed, seed == 3 ? 2 : 1, have, 4);
		CHECK(nw == nh);
		for (int i = 0; i < nw && i < nh; i++) {
			bool ok = close_outputs(&want[i], &have[i]);
			CHECK(ok);
			if (!ok)
				fprintf(stderr, "case '%s': output %d differs (seed %llu)\n", pc->what, i,
				        (unsigned long long)seed);
		}
		for (int i = 0; i < 4; i++) {
			tern_tensor_free(&want[i]);
			tern_tensor_free(&have[i]);
		}
	}

	/* A fixed point: optimising the saved result again changes nothing. */
	void *bytes = NULL;
	size_t size = 0;
	CHECK_OK(tern_model_save_bytes(after, &bytes, &size));
	tern_model *again = NULL;
	CHECK_OK(tern_model_load_bytes(bytes, size, "again", NULL, &again));
	if (again) {
		int more;
		optimize(again, pc, &more);
		CHECK(more == 0);
		char *twice = body(again);
		CHECK(twice && got && strcmp(twice, got) == 0);
		free(twice);
	}
	free(bytes);
	free(got);
	tern_model_free(again);
	tern_model_free(before);
	tern_model_free(after);
}

/* ---------------------------------------------------------------- the rest of the interface */

static void test_interface(void)
{
	CHECK(tern_pass_count() >= 15);
	for (int i = 0; i < tern_pass_count(); i++) {
		CHECK(tern_pass_name(i) && *tern_pass_name(i));
		CHECK(tern_pass_description(i) && !strchr(tern_pass_description(i), '\n'));
		CHECK(tern_pass_level(i) >= 1 && tern_pass_level(i) <= 3);
	}
	CHECK(tern_pass_name(tern_pass_count()) == NULL);

	tern_model *m = load(HEADER "g (float[N,4] x) => (float[N,4] y) {\n   y = Relu (x)\n}\n");
	const char *bad[] = {"no-such-pass"};
	tern_optimize_options o = {2, bad, 1, NULL, NULL, 0};
	CHECK(tern_optimize(m, &o, NULL, NULL) == TERN_EUSAGE);
	CHECK(strstr(tern_error(), "no-such-pass") != NULL);
	o = (tern_optimize_options){7, NULL, 0, NULL, NULL, 0};
	CHECK(tern_optimize(m, &o, NULL, NULL) == TERN_EUSAGE);

	/* --dim makes the dimension static in the file. */
	const char *names[] = {"N"};
	int64_t values[] = {3};
	o = (tern_optimize_options){2, NULL, 0, names, values, 1};
	CHECK_OK(tern_optimize(m, &o, NULL, NULL));
	int dtype, rank;
	int64_t dims[TERN_MAX_RANK];
	CHECK_OK(tern_model_input_type(m, 0, &dtype, &rank, dims, NULL));
	CHECK(rank == 2 && dims[0] == 3 && dims[1] == 4);
	const char *unknown[] = {"M"};
	o = (tern_optimize_options){2, NULL, 0, unknown, values, 1};
	CHECK(tern_optimize(m, &o, NULL, NULL) == TERN_EUSAGE);
	tern_model_free(m);
}

int main(void)
{
	for (size_t i = 0; i < TERN_ARRAY_LEN(cases); i++)
		test_case(&cases[i]);
	test_interface();
	return check_report("test_passes");
}
