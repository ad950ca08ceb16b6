// Activation checkpointing (autograd/checkpoint.h): a checkpointed block gives the same outputs and the same
// gradients (inputs and parameters) as the plain block, bit for bit on the CPU, dropout included; it keeps
// nothing of the block's inside for backward; the generators are rewound for the recompute and left as the
// plain run leaves them.
#include "support/catch.h"
#include "support/testing.h"

#include <memory>

#include "hadatrain/autograd/checkpoint.h"
#include "hadatrain/autograd/grad_mode.h"
#include "hadatrain/autograd/node.h"
#include "hadatrain/nn/layers.h"

using namespace ht;

namespace {

// x + fc2(dropout(gelu(fc1(layer_norm(x))))): a pre-norm MLP block with dropout.
class Block final : public nn::Module {
 public:
  Block(int64_t dim, Generator& init, std::shared_ptr<Generator> drop) {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(dim));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(dim, 3 * dim, nn::Bias::yes, init));
    act = register_module("act", std::make_shared<nn::Activation>(nn::ActivationKind::gelu));
    drop_ = register_module("drop", std::make_shared<nn::Dropout>(0.3, std::move(drop)));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(3 * dim, dim, nn::Bias::yes, init));
  }
  std::string type_name() const override { return "Block"; }
  Tensor forward(const Tensor& x) override {
    return add(x, fc2->forward(drop_->forward(act->forward(fc1->forward(norm->forward(x))))));
  }
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Activation> act;
  std::shared_ptr<nn::Dropout> drop_;
};

struct Model {
  std::shared_ptr<Generator> drop = std::make_shared<Generator>(77);
  Generator init{5};
  Tensor embed_in;  // a leaf the first block's input depends on
  std::shared_ptr<Block> b1, b2;
  Model() {
    b1 = std::make_shared<Block>(6, init, drop);
    b2 = std::make_shared<Block>(6, init, drop);
    b1->to(DType::f64);
    b2->to(DType::f64);
    embed_in = test::random_tensor({4, 5, 6}, 3);
    embed_in.set_requires_grad(true);
  }
  enum class How { plain, checkpointed, checkpointed_without_generator };
  // sum(w * b2(b1(2 * embed_in))) with fixed weights w: a scalar whose gradient reaches everything.
  Tensor loss(How how) {
    const Tensor x = mul(embed_in, 2.0);
    Tensor h;
    if (how == How::plain) {
      h = b2->forward(b1->forward(x));
    } else {
      CheckpointOptions o;
      if (how == How::checkpointed) o.generators = {drop.get()};
      auto run = [&](Block& b, const Tensor& in) {
        return checkpoint([&b](const std::vector<Tensor>& v) { return std::vector<Tensor>{b.forward(v[0])}; }, {in},
                          o)[0];
      };
      h = run(*b2, run(*b1, x));
    }
    return sum(mul(h, test::random_tensor({4, 5, 6}, 9)));
  }
  std::vector<Tensor*> leaves() {
    std::vector<Tensor*> out{&embed_in};
    for (Tensor* p : b1->parameters()) out.push_back(p);
    for (Tensor* p : b2->parameters()) out.push_back(p);
    return out;
  }
  void zero_grad() {
    for (Tensor* t : leaves()) t->zero_grad();
  }
};

}  // namespace

TEST_CASE("checkpointed blocks give the plain blocks' loss and gradients bit for bit, dropout included",
          "[checkpoint]") {
  Model m;
  const uint64_t start = m.drop->state();
  const Tensor plain_loss = m.loss(Model::How::plain);
  plain_loss.backward();
  const uint64_t after_plain = m.drop->state();
  REQUIRE(after_plain == start + 2);  // one dropout stream per block
  std::vector<Tensor> plain_grads;
  for (Tensor* t : m.leaves()) {
    REQUIRE(t->grad().defined());
    plain_grads.push_back(t->grad().clone());
  }

  m.zero_grad();
  m.drop->set_state(start);
  const Tensor ck_loss = m.loss(Model::How::checkpointed);
  CHECK(ck_loss.grad_fn() != nullptr);
  CHECK(ck_loss.item() == plain_loss.item());
  ck_loss.backward();
  // The recompute drew its streams from the rewound generator and left it where the forward had.
  CHECK(m.drop->state() == after_plain);
  const std::vector<Tensor*> leaves = m.leaves();
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    INFO("leaf " << i);
    REQUIRE(leaves[i]->grad().defined());
    CHECK(test::compare(leaves[i]->grad(), plain_grads[i], 0.0, 0.0) == "");
  }

  // Without the generator the recompute draws new masks: the gradients differ (what the rewind is for).
  m.zero_grad();
  m.drop->set_state(start);
  m.loss(Model::How::checkpointed_without_generator).backward();
  CHECK(test::compare(m.b1->fc1->weight.grad(), plain_grads[1 + 2], 0.0, 0.0) != "");
}

TEST_CASE("a checkpointed block keeps only its input for backward", "[checkpoint]") {
  Model m;
  const Tensor x = mul(m.embed_in, 2.0);
  const std::vector<Tensor> out =
      checkpoint([&](const std::vector<Tensor>& v) { return std::vector<Tensor>{m.b1->forward(v[0])}; }, {x},
                 {.generators = {m.drop.get()}});
  REQUIRE(out.size() == 1);
  const auto& node = out[0].grad_fn();
  REQUIRE(node != nullptr);
  CHECK(node->name() == "CheckpointBackward");
  CHECK(node->saved_bytes() == static_cast<std::size_t>(x.numel()) * sizeof(double));
  // Its only edge is the input's; the block's parameters are reached from inside its backward.
  REQUIRE(node->next_edges().size() == 1);
  CHECK(node->next_edges()[0].fn == x.grad_fn());
}

TEST_CASE("checkpoint with grad mode off is the plain call, and integer outputs carry no history",
          "[checkpoint]") {
  Model m;
  {
    NoGradGuard no_grad;
    const Tensor x = mul(m.embed_in, 2.0);
    const auto out = checkpoint([&](const std::vector<Tensor>& v) { return std::vector<Tensor>{m.b1->forward(v[0])}; },
                                {x});
    CHECK(out[0].grad_fn() == nullptr);
  }
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3}, {3}, {DType::i64});
  const auto out = checkpoint(
      [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0], mul(m.embed_in, 3.0)}; }, {ids});
  CHECK(!out[0].requires_grad());
  CHECK(out[1].grad_fn() != nullptr);
  // The recompute's parameter gradient arrives although no input of the checkpoint needed one.
  sum(out[1]).backward();
  REQUIRE(m.embed_in.grad().defined());
  CHECK(test::compare(m.embed_in.grad(), full({4, 5, 6}, 3.0, {DType::f64}), 0.0, 0.0) == "");
}
