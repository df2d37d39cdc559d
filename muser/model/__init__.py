"""muser.model: the layer map, weights, loaders, tokenizer and the functional transformer.

    spec.py               spec_from_hf_config -> ModelSpec (with spec_gguf.py, the ONLY place a layer's kind is decided)
    spec_gguf.py          spec_from_gguf: a GGUF header through spec.py's / spec_layers.py's helpers
    spec_layers.py        the per-layer rules both read through: layer types / pattern, a type's RoPE, LayerSpecs
    weights.py            Weights / LayerWeights: explicit tensors, effective norm multipliers
    gguf_file.py          GGUFFile: fast memory-mapped GGUF header + tensor views
    dequant.py            ggml block formats -> torch (bitwise equal to gguf-py)
    gguf_loader.py        load_gguf, raw_q8_0
    safetensors_loader.py load_hf_dir
    tokenizer.py          Tokenizer, StreamDecoder, load_tokenizer, require_tokenizer
    transformer.py        device-free maths: embed / layer_forward(attend callback, ops table) /
                          final_hidden / logits, forward_reference
    ops.py                `Ops` and the eager table `EAGER`: norms, qk-norm + RoPE, act * up,
                          residual add + norm; RoPE tables and rotation
    quant.py, quantize.py int8 weights and FastLinear (the CPU fast path; chosen by backends/cpu)
    native.py + csrc/     CPU kernels in C (int8 GEMV, norm + RoPE, decode attention), built on first use
    native_build.py       the C kernels' build (cc, cached by source / compiler / CPU) and ctypes load
                          (called by backends/cpu; the CUDA kernels live in backends/cuda)

Submodules are imported on demand (transformers and gguf are heavy), so this
package file imports nothing.
"""
