# Sourced by scripts/setup-llamacpp.sh and scripts/llamacpp.sh: where the llama.cpp server and
# its GGUF model live, so that the script that builds them and the one that runs them agree.
# Needs REPO (the repository root). Everything is kept outside the clone, so CI runs on the same
# machine reuse the build.
# Overrides: INCONTEXT_CACHE (cache root, default ~/.cache/incontext),
#            INCONTEXT_LLAMACPP_DIR (this version's directory inside it).
LLAMACPP_PY_VERSION="0.3.36"   # llama-cpp-python sdist that vendors the llama.cpp sources
LLAMACPP_SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMACPP_CACHE="${INCONTEXT_CACHE:-$HOME/.cache/incontext}"
LLAMACPP_DIR="${INCONTEXT_LLAMACPP_DIR:-$LLAMACPP_CACHE/llamacpp-$LLAMACPP_PY_VERSION}"
LLAMACPP_SRC="$LLAMACPP_DIR/src/llama_cpp_python-$LLAMACPP_PY_VERSION/vendor/llama.cpp"
LLAMACPP_BIN="$LLAMACPP_DIR/bin/llama-server"
LLAMACPP_GGUF="$LLAMACPP_DIR/model/qwen3-tiny-f16.gguf"
