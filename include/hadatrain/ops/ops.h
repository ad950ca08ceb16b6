// All ops, for code that uses many of them.
#pragma once
#include "hadatrain/ops/copy.h"
#include "hadatrain/ops/elementwise.h"
#include "hadatrain/ops/linalg.h"
#include "hadatrain/ops/nn_ops.h"
#include "hadatrain/ops/reduce.h"
#include "hadatrain/ops/shape_ops.h"
#include "hadatrain/tensor/factory.h"
