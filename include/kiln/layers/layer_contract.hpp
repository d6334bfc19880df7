// The contract between a static layer type and kiln::Sequential (static/sequential.hpp, with its plan, state and
// executor) and the blocks (static/blocks.hpp), written out: every member they read, with what it requires of the caller and what the layer ensures in return, and every optional
// capability with how it is detected. Documentation only: this header declares nothing, and the example layer below
// sits in #if 0. Where this text and the code disagree, the code is right and this file has a bug.
//
// Terms. L: a layer type as written in Sequential<Policy, Input<...>, L...>. In: the kiln::dims<...> of one input
// sample. B = L::template bind<In>: L bound to its input. T: the Input's value_type (float or double). Policy: the
// model's policy. n = ctx.batch, with 1 <= n <= max_batch. "Policy memory": Policy::buffer memory, which is device
// memory on the CUDA policies: touch it through Policy's functions (raw loads and stores only where
// Policy::host_accessible). "Before" and "after" are positions in the type list; in a backward pass, the layer after
// runs first.
//
// General rules.
//  - The Sequential never creates an L or a B. Every member is static, the configuration is in L's template
//    arguments, and every number a layer keeps lives in memory the Sequential owns. (io/onnx.hpp creates L{} as a tag
//    to choose an onnx_emit overload, so keep L an empty struct that can be default-constructed.)
//  - forward and backward allocate nothing (a training step allocates nothing; tests count allocations). They do not
//    wait for the device or read device memory on the host, because on a GPU policy enqueue_train_step is recorded
//    into a CUDA graph. A size check that fails with kiln::fail is fine.
//  - All sizes per sample are compile-time constants. n is the only run-time size.
#pragma once

#if 0  // documentation: a layer with every member the Sequential knows of

struct example_layer {
  // ---- Required, on L -----------------------------------------------------------------------------------------------
  // requires: In is some kiln::dims<...>.
  // ensures:  true exactly when the layer can take samples of shape In. layer_fits reads it before forming B.
  template <class In>
  static constexpr bool accepts = In::rank == 1;
  // Convention; no code reads it. The shape-error message sends the reader here. It says in words what accepts wants,
  // and how to fix a mismatch where there is a fix: "a flat input (rank 1): put kiln::Flatten before it".
  static constexpr const char* requirement = "a flat input (rank 1): put kiln::Flatten before it";
  // Convention, not read by the Sequential: the layer's short name.
  static constexpr const char* name = "Example";

  // ---- Its own fused activation (optional; on L, not on B) ----------------------------------------------------------
  // Detected by: requires { L::fused_activation; } (detail::has_fused_activation).
  // ensures: the activation the layer applies to its own output; activation::identity means none. Other than
  //          identity, the layer counts as two PyTorch modules, the Linear and then the activation. The next layer's
  //          names therefore start one index later ("0.weight", then "2.weight"), as in the equivalent
  //          torch.nn.Sequential, and io/onnx.hpp emits the activation as a node of its own. forward applies the
  //          activation (fuse says how), and backward applies the activation's backward first. If the activation is
  //          relu, the layer after it may take in that backward (backward_through_relu, below).
  static constexpr activation fused_activation = activation::identity;

  // ---- Being an activation layer (on L) -----------------------------------------------------------------------------
  // Detected by: requires { L::kind; L::slope; }. Only when both exist is L::is_activation read, so the three go
  //              together; an activation layer declares is_activation = true, static constexpr activation kind, and
  //              static constexpr double slope.
  // ensures: is_activation: y = f(x) element by element, with f = kind (and slope, LeakyReLU's negative slope),
  //          output = In, and no parameters. kind and slope feed the two activation fusions below, and Dense<N, Act>
  //          static_asserts Act::is_activation. Other layers declare is_activation = false (Dense and the RNNs omit
  //          it).
  static constexpr bool is_activation = false;

  // requires: In as for accepts, including an In that accepts rejects. layer_fits's static_assert does not stop the
  //           compiler from forming B after it, so B must still compile for any dims. Guard geometry as Conv2D's bind
  //           does ("g.out_height > 0 ? g.out_height : 1"), or the one shape error drowns in follow-on errors.
  template <class In>
  struct bind {
    // ensures: the kiln::dims<...> of one output sample. The summary, the workspace plan and the next layer's bind
    //          read it.
    using output = kiln::dims<In::size>;
    // ensures: the number of trainable values (0 or more). This is the layer's slice of the flat parameter buffer and
    //          of the gradient buffer. Each slice starts on a 16-element boundary (64 bytes for float), and the padding
    //          between slices stays zero.
    static constexpr index_t param_count = In::size;
    // ensures: values per sample that the layer keeps from its forward to its backward (saved pre-activations, masks,
    //          column matrices, statistics) or uses as temporary space. The Sequential plans
    //          scratch_per_sample * max_batch values (rounded up to 16) for this layer alone. They are not
    //          initialised. With 0 the layer gets a null scratch.
    static constexpr index_t scratch_per_sample = 0;
    // ensures: false for a layer that computes something. For true, see the in-place section below the class.
    static constexpr bool aliases_input = false;

    // requires: param_count > 0 (the Sequential calls init only then, so a layer without parameters may omit it).
    //           params: param_count values in host memory, already zeroed. rng: fork k of random_generator(seed),
    //           where this is the k-th layer with parameters, counting from 0.
    // ensures:  params holds the initial values, drawn the way dynamic mode's module draws them after
    //           kiln::manual_seed(seed) (PyTorch's default initialisation), so both modes start from the same numbers.
    template <class T>
    static void init(T* params, random_generator& rng);

    // requires: params: this layer's param_count values. buffers: its buffer_count values (any pointer, maybe null,
    //           when it has none). x: n * In::size values, read-only: it may be the caller's own batch. y: n *
    //           output::size values that do not overlap x. scratch: as planned, or null. All of these are in Policy
    //           memory. ctx.training: the model's mode, or true inside train_step. ctx.rng: non-null only for a layer
    //           that draws_at_run_time. ctx.input_as_in_forward: false. fuse: static_options::fuse_epilogues (also in
    //           ctx.fuse_epilogues, which a block's backward reads to lay its layers out as its forward did).
    //           ctx.replicas: in data-parallel training, the sums over the model's replicas (Sequential::set_replicas,
    //           which distributed::static_data_parallel calls), in this pass and its backward; null for a model alone.
    //           A sum over them is a collective: a layer sums only where every replica does the same at the same
    //           point (SyncBatchNorm: in each training forward and backward, which data-parallel training runs on
    //           every replica in step), never in evaluation, which replicas run on their own.
    // ensures:  y = the layer's function of x. The result is the same whatever fuse says (within float rounding); fuse
    //           may change only how it is computed (Dense applies its activation in the GEMM's epilogue, or as a pass
    //           of its own). Whatever backward will need is left in scratch. In training, forward may update buffers
    //           (running statistics); in evaluation it leaves them unchanged.
    template <class Policy, class T>
    static void forward(const T* params, T* buffers, const T* x, T* y, T* scratch, const layer_context& ctx,
                        bool fuse);

    // requires: this layer's forward ran just before, in the same Sequential call, with the same batch and training
    //           flag; x, y and scratch are as that forward left them. ctx.input_as_in_forward is true, which says so,
    //           and ctx.training is true. dy: n * output::size values holding dL/dy. dx: n * In::size values, or null
    //           when every layer before this one aliases its input (the first layer, or one after only Flatten
    //           layers). dparams: this layer's param_count gradient values. Never called when aliases_input is true.
    // ensures:  when dx is non-null, dx is overwritten with dL/dx. dparams[0, param_count) is overwritten with
    //           dL/dparams; it is not added to (static mode overwrites gradients; dynamic mode adds). Nothing past
    //           param_count is written: beyond it lies zero padding or the next layer's gradients, so a layer with
    //           param_count 0 writes nothing through dparams. dy and scratch may be overwritten (Dense runs its
    //           activation's backward in place on dy; the RNNs overwrite their saved gates), so backward runs once
    //           for each forward. backward gets no buffers pointer: whatever it needs from buffers, forward saves in
    //           scratch.
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T* y, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx);

    // ensures: the layer's name in summary(), step profiles and error messages, such as "Conv2D(3x3, padding=1)".
    //          It depends on the type alone.
    static std::string description();

    // ---- Parameters by name (optional in the code; a layer with param_count > 0 needs it) ---------------------------
    // Detected by: requires { B::parameter_tensors(); }.
    // ensures: the layer's parameter tensors in PyTorch's order and with PyTorch's names ("weight", "bias",
    //          "weight_ih_l0"). Each has its shape and its offset within the layer's slice, and together they cover
    //          [0, param_count) exactly (nothing checks this). Names contain no '.': the Sequential adds the prefix
    //          "<module index>." and io/onnx.hpp splits names on the dot. Without parameter_tensors, the layer's
    //          parameters are still trained, but they are missing from state_dict, load_state_dict, parameter(name),
    //          per-tensor optimizer slots and tensor_ranges (gradient clipping by norm).
    static std::vector<static_parameter_info> parameter_tensors();

    // ---- Parameters without padding (optional; a block of layers) ---------------------------------------------------
    // Detected by: requires { B::parameter_values; }. Without it, param_count is read.
    // ensures: the trainable values in [0, param_count) that belong to tensors: a block aligns each of its layers'
    //          slices as the Sequential does, so its param_count holds padding that parameter counts leave out.
    static constexpr index_t parameter_values = In::size;

    // ---- Several init streams (optional; a block of layers, static/blocks.hpp) -------------------------------------
    // Detected by: requires { B::init_stream_count; }. Without it, a layer with parameters takes one stream.
    // ensures: init draws from the streams k, k + 1, ..., k + init_stream_count - 1 of the seed, where rng (stream k)
    //          says k, one for each parameterised layer inside, and the next layer's stream is k + init_stream_count:
    //          dynamic mode's modules of the same nesting take one stream each, in the same order.
    static constexpr std::uint64_t init_stream_count = 1;

    // ---- Buffers: state that is saved but not trained (optional) ----------------------------------------------------
    // Detected by: requires { B::buffer_count; B::buffer_tensors(); }. Both must be present, or neither counts (and
    //              the layer's buffers pointer then points at the next layer's buffers).
    // ensures: the layer's values in the flat buffer of buffers (for example BatchNorm's running statistics). They
    //          are saved and loaded with state_dict and copied with the model. The optimizer never sees them, and
    //          forward alone can change them.
    static constexpr index_t buffer_count = 0;
    // ensures: names, shapes and offsets, as parameter_tensors gives them, covering [0, buffer_count). state_dict
    //          lists them after the same layer's parameters.
    static std::vector<static_parameter_info> buffer_tensors();
    // requires: buffers: buffer_count values in host memory. They are zero at construction, but on a host policy
    //           initialize(seed) leaves whatever the model had trained.
    // ensures:  every one of the values holds its initial value (BatchNorm: mean 0, variance 1, count 0).
    template <class T>
    static void init_buffers(T* buffers);

    // ---- Random numbers at run time (optional) ----------------------------------------------------------------------
    // Detected by: requires { B::draws_at_run_time; }, read as a bool. Without it, the value is false.
    // ensures (true): forward draws random numbers (dropout masks). The Sequential gives the layer a generator of its
    //          own: the k-th such layer gets random_generator(seed, runtime_stream_base + k). That is the stream
    //          dynamic mode gives its k-th drawing module, and checkpoints save it (runtime_generators()). ctx.rng
    //          points to it in every forward and backward, in training and in evaluation. The layer draws only in
    //          training and only from ctx.rng, and keeps in scratch what backward needs (the mask).
    static constexpr bool draws_at_run_time = false;
    // ---- Several run-time generators (optional; a block of layers, static/blocks.hpp) ------------------------------
    // Detected by: requires { B::runtime_generator_count; }. Without it, a layer that draws takes one generator.
    // ensures: the layer takes that many generators, consecutive, ctx.rng pointing to the first: one for each layer
    //          inside that draws, in the order dynamic mode's modules of the same nesting take their streams.
    static constexpr std::size_t runtime_generator_count = 0;

    // ---- Taking in the activation layer after it (optional) ---------------------------------------------------------
    // Detected by: the fusion rule activation_into_producer (static/fusion_rules.hpp), whose pattern calls
    //              B::forward_activated<Policy> with the next layer's kind and slope. It is used with fuse_epilogues
    //              on, when the next layer is an activation whose kind is not identity and whose gradient needs only
    //              its output (activation_grad_needs_input is false, so not GELU).
    // requires: as forward. act and slope are the next layer's f.
    // ensures:  y = act(the y forward would write). The activation layer's forward is skipped: its output is this y.
    //           y then no longer holds this layer's own output, so this layer's backward must not read y (Conv2D's
    //           reads only x). The activation's backward still runs, and works from its output alone.
    template <class Policy, class T>
    static void forward_activated(const T* params, T* buffers, const T* x, T* y, T* scratch, const layer_context& ctx,
                                  activation act, T slope);

    // ---- Taking in the backward of the activation layer before it (optional) ----------------------------------------
    // Detected by: the fusion rule activation_backward_into_consumer, whose pattern calls B::backward_activated<Policy>,
    //              when the layer before is an activation whose kind is not identity. It is used with fuse_epilogues
    //              on. To make it depend on the
    //              policy, put a requires-clause on the policy's kernel (as Conv2D and MaxPool2D do).
    // requires: as backward, with these differences. x is the activation's output. dx is the gradient of the
    //           activation's INPUT (null when none is wanted). act_input is the activation's input whenever its
    //           gradient needs it (GELU). Otherwise act_input may be the activation's output, when that activation was
    //           also taken into the layer before it by forward_activated. So compute such an activation's derivative
    //           from x.
    // ensures:  when dx is non-null, dx = f'(.) * dL/dx, and dparams is written as backward writes it. The
    //           activation layer's backward is skipped.
    template <class Policy, class T>
    static void backward_activated(const T* params, const T* x, const T* y, T* dy, T* dx, T* dparams, T* scratch,
                                   const layer_context& ctx, activation act, const T* act_input, T slope);

    // ---- Taking in the ReLU backward of the layer before it (optional, a pair) --------------------------------------
    // Detected by: the fusion rule relu_backward_into_head: fused_activation == activation::relu on the layer before,
    //              and one requires-expression that calls this B::backward_through_relu_applies<Policy, T>,
    //              B::backward_through_relu<Policy> and the layer before's backward_preactivated<Policy>. It is used
    //              with fuse_epilogues on, where backward_through_relu_applies says so and no other rule took either
    //              position.
    // ensures: whether this pass can take the ReLU's backward in. A pure function of ctx (the batch) and the policy's
    //          settings: the rule asks it once per pass, and the answer decides how both layers of the pair run.
    template <class Policy, class T>
    static bool backward_through_relu_applies(const layer_context& ctx);
    // requires: as backward, and backward_through_relu_applies(ctx). x is the output of the layer before, after its
    //           ReLU; dx is non-null.
    // ensures:  dparams written as backward writes it, and dx = the gradient of the layer before's PRE-activation
    //           (its ReLU's backward, computed from x, already applied). The layer before then runs
    //           backward_preactivated instead of its backward.
    template <class Policy, class T>
    static void backward_through_relu(const T* params, const T* x, const T* y, T* dy, T* dx, T* dparams, T* scratch,
                                      const layer_context& ctx);
    // requires: as backward, except that dy already holds the gradient of this layer's pre-activation: the layer
    //           after it has applied this layer's fused activation's backward.
    // ensures:  as backward, without applying the activation's backward again.
    template <class Policy, class T>
    static void backward_preactivated(const T* params, const T* x, const T* y, T* dy, T* dx, T* dparams, T* scratch,
                                      const layer_context& ctx);
  };
};

// ---- In place: the output is the input (B::aliases_input = true) ----------------------------------------------------
// requires: output::size == In::size (nothing checks this), and the layer computes nothing: y is x under another shape
//           (Flatten, Identity).
// ensures:  the Sequential plans no output or gradient memory for the layer (scratch_per_sample should be 0).
//           forward is still called, with y == x (const cast away), and must write nothing. backward is never called:
//           the gradient passes straight through, because the layer after this one writes its dx where the layer
//           before reads its dy. Layers that compute in place on a buffer they share are not supported. A Sequential
//           whose layers all alias their input is a compile error.

// ---- How the Sequential uses a layer --------------------------------------------------------------------------------
// Binding (at compile time, static/plan.hpp): bind_layers binds each L to the output of the one before it, starting
// from the Input's shape. The plan derives the parameter offsets, the buffer offsets, each layer's run-time
// generators and the state_dict names.
// Construction(max_batch, seed): the state (static/state.hpp) allocates, once and in Policy memory, the parameters,
// the gradients (zeroed) and the buffers (zeroed), and runs initialize(seed): on the host, for each layer in order,
// init (when param_count > 0) and init_buffers (when the layer has buffers); the results are uploaded. The executor
// (static/executor.hpp) plans one workspace by liveness: for each layer that does not alias, an output and a gradient
// of output::size * max_batch values each, plus its scratch, placed so that tensors whose lives in a step are apart
// share memory (static/workspace_plan.hpp).
// forward, predict (in chunks of max_batch, evaluation mode) and loss_value run the forwards, in order, with one
// layer_context {n, training}. Each layer's input is the previous layer's output, and the first layer reads the staged
// or resident batch. These passes may run any number of times without a backward.
// train_step = forward_backward + update:
//   1. before each pass the fusion rules (static/fusion_rules.hpp) choose how each position runs; a position no rule
//      takes runs the layer's own forward or backward;
//   2. every forward, with ctx.training = true, in order;
//   3. the loss writes dL/d(output) into the gradient of the last layer that computes;
//   4. the backwards in reverse order, in the same call, with ctx.input_as_in_forward = true. Each layer's dx is the
//      dy of the nearest computing layer before it (null for the first computing layer). Never for a layer that
//      aliases its input;
//   5. the optimizer steps over the flat parameter and gradient buffers (frozen layers still get gradients).
// Ownership: the Sequential owns all memory and hands layers pointers into it. A layer's slices of params, dparams and
// buffers persist for the model's lifetime and are copied with the model. Its output, its gradient and its scratch
// hold their values only within one pass: from its forward to its backward for the output and the scratch, from the
// backward that writes it to its own backward for the gradient; afterwards the memory may hold another layer's
// tensors (the model's output excepted, which last_output reads after a step). A copy of the model gets a fresh
// workspace. The blocks run their layers the same way inside their scratch, fusion rules included.

// ---- Shape errors ---------------------------------------------------------------------------------------------------
// An L that does not accept its In stops compilation at the static_assert in layer_fits<Previous, L, In>
// (static/shape_check.hpp). Its message reads "kiln::Sequential shape mismatch: the layer named second in
// layer_fits<previous layer, layer, shape> ...", and the compiler prints the template arguments: the layer before (the
// Input<...> for the first layer), the layer, and the shape. The text of `requirement` tells how to fix it. A layer's
// own checks of its template arguments are static_asserts on L whose message starts with the layer's name, for
// example "kiln::Dense<Out>: Out must be positive". Run-time failures (batch and target shapes, state_dict names) are
// kiln::fail messages of the form "where: expected ..., found ...".

#endif
