// The parameter store: materialise in a compute dtype (values, the gradient reaching the f32 master), every
// parameter of a forward going through the one call (a recording policy), optimisers over a store equal to
// optimisers over plain references bit for bit, and the model and optimiser state round trip.
#include "support/catch.h"
#include "support/testing.h"

#include <map>
#include <set>

#include "hadatrain/models/resnet.h"
#include "hadatrain/models/vit.h"
#include "hadatrain/nn/parameter_store.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/optim/optimizer.h"

using namespace ht;

namespace {

// Records each materialise call (parameter name and dtype asked for) and hands over what the default
// policy gives.
class RecordingPolicy final : public nn::MaterialisePolicy {
 public:
  Tensor materialise(const nn::MaterialiseRequest& r) override {
    calls.emplace_back(r.param.name, r.dtype);
    Tensor out = cast.materialise(r);
    given[r.param.name] = out;
    return out;
  }
  std::vector<std::pair<std::string, DType>> calls;
  std::map<std::string, Tensor> given;
  nn::CastPolicy cast;
};

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

// A small model with a Linear, a LayerNorm and a second Linear (decayed weights, undecayed biases/norm).
std::shared_ptr<nn::Sequential> small_mlp(uint64_t seed) {
  Generator gen(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(6, 8, nn::Bias::yes, gen));
  m->push_back(std::make_shared<nn::LayerNorm>(8));
  m->push_back(std::make_shared<nn::Activation>(nn::ActivationKind::gelu));
  m->push_back(std::make_shared<nn::Linear>(8, 4, nn::Bias::yes, gen));
  return m;
}

// `steps` steps of cross-entropy training with a bf16 forward on fixed synthetic data.
void train(nn::Module& m, optim::Optimizer& opt, int steps, uint64_t data_seed) {
  Generator gen(data_seed);
  const Tensor x = randn({5, 6}, gen).to(DType::bf16);
  const Tensor y = from_vector(std::vector<int64_t>{0, 3, 1, 2, 3}, {5}, {DType::i64});
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    cross_entropy(m.forward(x), y).backward();
    opt.step(0.05);
  }
}

void check_same_parameters(nn::Module& a, nn::Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(pa[i].first == pb[i].first);
    CHECK(values(*pa[i].second) == values(*pb[i].second));
  }
}

}  // namespace

TEST_CASE("materialise gives a bf16 weight whose gradient reaches the f32 master", "[parameter_store]") {
  Generator gen(7);
  nn::Linear lin(5, 3, nn::Bias::yes, gen);
  auto store = nn::ParameterStore::attach(lin);
  auto rec = std::make_shared<RecordingPolicy>();
  store->set_policy(rec);
  const Tensor x = randn({4, 5}, gen).to(DType::bf16);
  const Tensor y = lin.forward(x);
  CHECK(y.dtype() == DType::bf16);
  REQUIRE(rec->given.count("weight") == 1);
  const Tensor w16 = rec->given.at("weight");
  CHECK(w16.dtype() == DType::bf16);
  CHECK(values(w16) == values(lin.weight.to(DType::bf16)));
  sum(y).backward();

  // The same product with the cast written out by hand: identical output and master gradients.
  Tensor w = lin.weight.detach().clone(), b = lin.bias.detach().clone();
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const Tensor y_ref = linear(x, w.to(DType::bf16), b.to(DType::bf16));
  sum(y_ref).backward();
  CHECK(values(y) == values(y_ref));
  REQUIRE(lin.weight.grad().defined());
  CHECK(lin.weight.grad().dtype() == DType::f32);
  CHECK(values(lin.weight.grad()) == values(w.grad()));
  CHECK(values(lin.bias.grad()) == values(b.grad()));

  // In the master dtype the layer computes with the master itself.
  rec->given.clear();
  lin.forward(randn({2, 5}, gen));
  CHECK(rec->given.at("weight").is_same(lin.weight));
  CHECK(nn::cast_master(lin.weight, DType::f32).is_same(lin.weight));
}

TEST_CASE("a module without a store computes as with the default store", "[parameter_store]") {
  auto a = small_mlp(3), b = small_mlp(3);
  auto store = nn::ParameterStore::attach(*b);
  Generator gen(4);
  const Tensor x = randn({3, 6}, gen).to(DType::bf16);
  CHECK(values(a->forward(x)) == values(b->forward(x)));
}

TEST_CASE("every parameter of a forward goes through materialise, in the dtype it computes in", "[parameter_store]") {
  SECTION("ViT") {
    models::VitConfig c;
    c.image_size = 8;
    c.patch_size = 4;
    c.in_channels = 1;
    c.dim = 8;
    c.depth = 1;
    c.heads = 2;
    c.num_classes = 3;
    Generator gen(1);
    models::VisionTransformer vit(c, gen, std::make_shared<Generator>(2));
    auto store = nn::ParameterStore::attach(vit);
    auto rec = std::make_shared<RecordingPolicy>();
    store->set_policy(rec);
    vit.forward(randn({2, 1, 8, 8}, gen).to(DType::bf16));
    std::map<std::string, DType> seen;
    for (const auto& [name, dtype] : rec->calls) CHECK(seen.emplace(name, dtype).second);  // once each
    for (const auto& [name, t] : vit.named_parameters()) {
      INFO(name);
      REQUIRE(seen.count(name) == 1);
      const bool norm = name.find("norm") != std::string::npos;
      CHECK(seen.at(name) == (norm ? DType::f32 : DType::bf16));
    }
    CHECK(seen.size() == vit.named_parameters().size());
  }
  SECTION("ResNet, channels last, fused batch norms") {
    Generator gen(1);
    models::ResNetConfig rc;
    rc.num_classes = 3;
    rc.in_channels = 1;
    rc.layout = ConvLayout::nhwc;
    models::ResNet r(rc, gen);
    auto store = nn::ParameterStore::attach(r);
    auto rec = std::make_shared<RecordingPolicy>();
    store->set_policy(rec);
    r.forward(randn({2, 1, 8, 8}, gen));
    std::set<std::string> seen;
    for (const auto& [name, dtype] : rec->calls) {
      CHECK(seen.insert(name).second);
      CHECK(dtype == DType::f32);
    }
    CHECK(seen.size() == r.named_parameters().size());
    const std::size_t i = store->index_of("layer2.0.bn2.weight");
    CHECK(rec->given.at("layer2.0.bn2.weight").is_same(*store->params()[i].param));  // the master itself
  }
}

TEST_CASE("the store follows Module::to(dtype) and rejects what it does not hold", "[parameter_store]") {
  auto m = small_mlp(5);
  auto store = nn::ParameterStore::attach(*m);
  auto rec = std::make_shared<RecordingPolicy>();
  store->set_policy(rec);
  m->to(DType::f64);
  Generator gen(6);
  m->forward(randn({2, 6}, gen, {DType::f64}));
  const Tensor& w = *store->params()[store->index_of("0.weight")].param;
  CHECK(w.dtype() == DType::f64);
  CHECK(rec->given.at("0.weight").is_same(w));
  CHECK_THROWS_WITH(store->index_of("0.wieght"), HasSubstr("no parameter named '0.wieght'"));
  CHECK_THROWS_WITH(store->materialise(zeros({2}), DType::f32), HasSubstr("not one of its parameters"));
  CHECK_THROWS_WITH(nn::ParameterStore::attach(*m), HasSubstr("already belongs to another live parameter store"));
  store.reset();
  CHECK_NOTHROW(nn::ParameterStore::attach(*m));
  auto params = nn::make_param_refs(m->named_parameters());
  params.pop_back();
  CHECK_THROWS_WITH(nn::ParameterStore::attach(*m, params), HasSubstr("has 6 parameters, 5 were given"));
}

TEST_CASE("optimisers over a store equal optimisers over plain references bit for bit", "[parameter_store][optim]") {
  SECTION("AdamW") {
    auto a = small_mlp(11), b = small_mlp(11);
    auto store = nn::ParameterStore::attach(*a);
    CHECK_FALSE(store->params()[1].decay);  // 0.bias
    auto oa = optim::make_adamw(store, {.weight_decay = 0.05});
    auto ob = optim::make_adamw(optim::make_param_refs(b->named_parameters()), {.weight_decay = 0.05});
    train(*a, *oa, 4, 12);
    train(*b, *ob, 4, 12);
    check_same_parameters(*a, *b);
    CHECK(&oa->store() == store.get());
    CHECK(oa->state_tensors().size() == 2 * store->size());
  }
  SECTION("SGD with momentum and Nesterov") {
    auto a = small_mlp(13), b = small_mlp(13);
    auto store = nn::ParameterStore::attach(*a);
    const optim::SgdOptions o{.momentum = 0.9, .weight_decay = 1e-3, .nesterov = true};
    auto oa = optim::make_sgd(store, o);
    auto ob = optim::make_sgd(optim::make_param_refs(b->named_parameters()), o);
    train(*a, *oa, 4, 14);
    train(*b, *ob, 4, 14);
    check_same_parameters(*a, *b);
    CHECK(oa->state_tensors().count("3.weight.momentum_buffer") == 1);
  }
}

TEST_CASE("model and optimiser state round trip through the store", "[parameter_store][optim]") {
  auto a = small_mlp(21), b = small_mlp(99);
  auto sa = nn::ParameterStore::attach(*a), sb = nn::ParameterStore::attach(*b);
  auto oa = optim::make_adamw(sa, {.weight_decay = 0.01});
  auto ob = optim::make_adamw(sb, {.weight_decay = 0.01});
  train(*a, *oa, 3, 22);
  CHECK(sa->state_dict().size() == a->state_dict().size());
  sb->load_state_dict(sa->state_dict());
  ob->load_state_tensors(oa->state_tensors(), oa->steps());
  CHECK(ob->steps() == 3);
  CHECK(values(sb->state(0, 0)) == values(sa->state(0, 0)));
  CHECK_FALSE(sb->state(0, 0).is_same(sa->state(0, 0)));  // copied, not shared
  train(*a, *oa, 2, 23);
  train(*b, *ob, 2, 23);
  check_same_parameters(*a, *b);

  auto partial = oa->state_tensors();
  partial.erase("3.bias.exp_avg_sq");
  CHECK_THROWS_WITH(ob->load_state_tensors(partial, 5), HasSubstr("'3.bias' has exp_avg but not exp_avg_sq"));

  // A standalone store (no module) loads and reports its parameters by name.
  Tensor w = zeros({2, 2});
  w.set_requires_grad(true);
  nn::ParameterStore plain({{"w", &w, true}});
  plain.load_state_dict({{"w", ones({2, 2})}});
  CHECK(values(w) == std::vector<float>(4, 1.0f));
  CHECK(plain.state_dict().at("w").storage() == w.storage());  // shared storage
  CHECK_THROWS_WITH(plain.load_state_dict({{"v", ones({2, 2})}}), HasSubstr("missing keys [w], unexpected keys [v]"));
}
