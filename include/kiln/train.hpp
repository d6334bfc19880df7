// The Keras-style training layer: Model, metrics, callbacks, progress bar, history.
#pragma once

#include "kiln/train/callbacks.hpp"
#include "kiln/train/confusion_matrix.hpp"
#include "kiln/train/dynamic_access.hpp"
#include "kiln/train/history.hpp"
#include "kiln/train/metrics.hpp"
#include "kiln/train/model.hpp"
#include "kiln/train/progress_bar.hpp"
