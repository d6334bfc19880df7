// Data-parallel training across processes over MPI (kept out of kiln.hpp: it needs <mpi.h>; link kiln::mpi): a process
// group (rank, world size, broadcast, all-reduce, barrier, with timeouts), the bucketed gradient reducer, data-parallel
// training in static mode (static_data_parallel) and dynamic mode (dynamic_data_parallel), and the sampler that gives
// each rank its shard of every epoch (distributed_sampler, shard_dataset), and kiln::Model over a static
// data-parallel model, whose fit trains across the processes (data_parallel_model). Run with mpirun -np N.
#pragma once

#include "kiln/distributed/data_parallel_model.hpp"
#include "kiln/distributed/distributed_sampler.hpp"
#include "kiln/distributed/dynamic_data_parallel.hpp"
#include "kiln/distributed/gradient_reducer.hpp"
#include "kiln/distributed/group_distribution.hpp"
#include "kiln/distributed/group_replicas.hpp"
#include "kiln/distributed/process_group.hpp"
#include "kiln/distributed/shard_dataset.hpp"
#include "kiln/distributed/static_data_parallel.hpp"
#include "kiln/distributed/sync_batch_norm.hpp"
