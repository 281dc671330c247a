#!/usr/bin/env bash
# Seed corpora for the fuzz targets, from the repository's own files. Usage:
#   fuzz/make_corpus.sh OUT_DIR
# Writes OUT_DIR/experiment/ (every experiment YAML: experiments/**, tests/experiments/good and
# bad, tests/fuzz_regressions/experiment) and OUT_DIR/run_record/, OUT_DIR/results_db/ (the
# regression inputs of those targets plus a few byte patterns; FuzzedDataProvider inputs have
# no natural files); OUT_DIR/import/ (the measured records results/*/*.json);
# OUT_DIR/safetensors/ and OUT_DIR/checkpoint/ (tiny Llama checkpoints in the layout
# runtime/checkpoint.h reads, written here byte by byte); OUT_DIR/calibration_profile/
# (results/profiles/*.yaml). Every target also gets its own regression inputs.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: make_corpus.sh OUT_DIR}
mkdir -p "$out/experiment" "$out/run_record" "$out/results_db"
n=0
while IFS= read -r -d '' f; do
  cp "$f" "$out/experiment/$(echo "${f#"$src"/}" | tr '/' '_')"
  n=$((n + 1))
done < <(find "$src/experiments" "$src/tests/experiments" "$src/tests/fuzz_regressions/experiment" \
           -name '*.yaml' -print0 2>/dev/null)
for target in run_record results_db; do
  if [ -d "$src/tests/fuzz_regressions/$target" ]; then
    cp "$src/tests/fuzz_regressions/$target"/* "$out/$target/" 2>/dev/null || true
  fi
  head -c 256 /dev/zero >"$out/$target/zeros"
  head -c 256 /dev/zero | tr '\0' '\377' >"$out/$target/ones"
  printf '\001\002\003\004\005\006\007\010%.0s' {1..32} >"$out/$target/counting"
done

# A safetensors image on stdout: tensors given as NAME:DTYPE:D0,D1,... (BF16/F32/I64 sizes),
# data bytes a repeating pattern, header padded with spaces to a multiple of 8 as the writer does.
safetensors() {
  local meta=$1
  shift
  local header="{" offset=0 sep="" spec name dtype shape bytes d
  [ -n "$meta" ] && header+="\"__metadata__\":{$meta}" && sep=","
  for spec in "$@"; do
    IFS=: read -r name dtype shape <<<"$spec"
    case $dtype in BF16) bytes=2 ;; F32) bytes=4 ;; I64) bytes=8 ;; esac
    for d in ${shape//,/ }; do bytes=$((bytes * d)); done
    header+="$sep\"$name\":{\"dtype\":\"$dtype\",\"shape\":[$shape],\"data_offsets\":[$offset,$((offset + bytes))]}"
    offset=$((offset + bytes))
    sep=","
  done
  header+="}"
  while [ $(( ${#header} % 8 )) -ne 0 ]; do header+=" "; done
  local n=${#header} i
  for i in 0 1 2 3 4 5 6 7; do printf "\\$(printf '%03o' $(( (n >> (8 * i)) & 255 )))"; done
  printf '%s' "$header"
  head -c "$offset" /dev/zero | tr '\0' '\074'
}
# The tensors of a 1-layer Llama: hidden 8, 2 q heads and 1 KV head of head_dim 4, MLP 16,
# vocab 16 (names and shapes as llama_weight_list gives them).
tiny_llama() {
  local p=model.layers.0.
  echo model.embed_tokens.weight:BF16:16,8 ${p}input_layernorm.weight:BF16:8 \
    ${p}self_attn.q_proj.weight:BF16:8,8 ${p}self_attn.k_proj.weight:BF16:4,8 \
    ${p}self_attn.v_proj.weight:BF16:4,8 ${p}self_attn.o_proj.weight:BF16:8,8 \
    ${p}post_attention_layernorm.weight:BF16:8 ${p}mlp.gate_proj.weight:BF16:16,8 \
    ${p}mlp.up_proj.weight:BF16:16,8 ${p}mlp.down_proj.weight:BF16:8,16 model.norm.weight:BF16:8
}
tiny_config() {  # $1: tie_word_embeddings, $2: extra fields
  printf '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16", '
  printf '"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, '
  printf '"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 16, '
  printf '"rms_norm_eps": 1e-05, "rope_theta": 500000.0, %s"tie_word_embeddings": %s}\n' "$2" "$1"
}
mkdir -p "$out/safetensors" "$out/checkpoint" "$out/import"
# shellcheck disable=SC2046
safetensors '' $(tiny_llama) lm_head.weight:BF16:16,8 >"$out/safetensors/tiny_llama"
safetensors '"format":"pt","twinstep_synthetic_seed":"7"' a:F32:2,3 b:I64:4 c:BF16:0 \
  >"$out/safetensors/dtypes_metadata"
safetensors '' >"$out/safetensors/empty_table"
{ tiny_config false ''; printf '\0\0'; cat "$out/safetensors/tiny_llama"; } \
  >"$out/checkpoint/untied"
{
  tiny_config true '"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, '
  printf '\0{"metadata": {"total_size": 1}, "weight_map": {'
  sep=""
  for spec in $(tiny_llama); do printf '%s"%s": "model.safetensors"' "$sep" "${spec%%:*}"; sep=", "; done
  printf '}}\0'
  # shellcheck disable=SC2046
  safetensors '' $(tiny_llama)
} >"$out/checkpoint/tied_rope_scaling_index"
cp "$src"/results/*/*.json "$out/import/"
chmod -R u+w "$out"
mkdir -p "$out/calibration_profile"
for f in "$src"/results/profiles/*.yaml; do
  [ -f "$f" ] && cp "$f" "$out/calibration_profile/"
done
for target in safetensors checkpoint import calibration_profile; do
  if [ -d "$src/tests/fuzz_regressions/$target" ]; then
    cp "$src/tests/fuzz_regressions/$target"/* "$out/$target/" 2>/dev/null || true
  fi
done
echo "seed corpus: $n experiment files in $out/experiment"
