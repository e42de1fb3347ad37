#!/usr/bin/env bash
# The README's run command: set up, build, and serve a model on 127.0.0.1:8000.
# Default model: the tiny V4.1-architecture fixture (its own 512-token vocabulary); pass a
# checkpoint directory as the first argument to serve another, further arguments go to serve.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
MODEL=${1:-tests/fixtures/deepseek-v41-flash-quant}
shift || true
echo "serving $MODEL on http://127.0.0.1:8000 ; try:"
echo "  curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "    -d '{\"model\": \"deepseek-ai/DeepSeek-V4.1-Flash\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 16}'"
exec build/ds41rt serve --model "$MODEL" --port 8000 "$@"
