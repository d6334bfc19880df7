// kiln data layer: readers (IDX, CSV, NPY), datasets (tensor_dataset, MNIST), data_loader and transforms.
// Kept out of kiln/kiln.hpp on purpose: file formats pull in zlib and <fstream>, which models do not need.
#pragma once

#include "kiln/data/byte_source.hpp"
#include "kiln/data/csv.hpp"
#include "kiln/data/data_loader.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/find_data.hpp"
#include "kiln/data/idx.hpp"
#include "kiln/data/mnist.hpp"
#include "kiln/data/npy.hpp"
#include "kiln/data/text.hpp"
#include "kiln/data/transforms.hpp"
