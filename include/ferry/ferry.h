// ferry/ferry.h — everything a user of the tensor layer needs, in one include.
#pragma once

#include "ferry/autograd.h"
#include "ferry/backend.h"
#include "ferry/determinism.h"
#include "ferry/device.h"
#include "ferry/dtype.h"
#include "ferry/error.h"
#include "ferry/factories.h"
#include "ferry/graph.h"
#include "ferry/ledger.h"
#include "ferry/ops.h"
#include "ferry/random.h"
#include "ferry/tensor.h"
