// Parameter initialisers matching PyTorch / torchvision / timm, drawing from an explicit Philox Generator.
#pragma once
#include "hadatrain/tensor/philox.h"
#include "hadatrain/tensor/tensor.h"

namespace ht::nn::init {

// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (PyTorch's convention).
int64_t fan_in(const Tensor& w);
int64_t fan_out(const Tensor& w);

// Fills t in place (any device) with values drawn from `gen`.
void uniform_(Tensor& t, double low, double high, Generator& gen);
void normal_(Tensor& t, double mean, double std, Generator& gen);
// Normal(mean, std) truncated to [a, b] (absolute bounds, as torch.nn.init.trunc_normal_), by inverse CDF.
void trunc_normal_(Tensor& t, double mean, double std, double a, double b, Generator& gen);
void constant_(Tensor& t, double value);
// nn.Linear / nn.Conv2d default: kaiming_uniform(a = sqrt(5)) == U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
void default_linear_weight_(Tensor& w, Generator& gen);
void default_linear_bias_(Tensor& b, int64_t fan_in, Generator& gen);
// kaiming_normal(mode = fan_out, nonlinearity = relu): N(0, sqrt(2 / fan_out)) — torchvision ResNet convs.
void kaiming_normal_fan_out_(Tensor& w, Generator& gen);

}  // namespace ht::nn::init
