// kiln's file formats, all of them (kept out of kiln.hpp, which stays light): safetensors weights with PyTorch's
// names (save_weights / load_weights), checkpoints that resume exactly (save_checkpoint / load_checkpoint) and ONNX
// export of Sequential models in both modes (export_onnx).
#pragma once

#include "kiln/io/checkpoint.hpp"
#include "kiln/io/onnx.hpp"
#include "kiln/io/onnx_dynamic.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/weights.hpp"
