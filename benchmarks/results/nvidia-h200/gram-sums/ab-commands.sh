# A/B: yirage-triton before (old) and after (new) the Gram sums, same session
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/yrsite .whl/cur/*.whl || exit 1
mkdir -p /tmp/yrsite_old && cp -r /tmp/yrsite/. /tmp/yrsite_old/ && rm -rf /tmp/yrsite_old/yirage_triton* && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/yrsite_old .whl/old/*.whl || exit 1
export PYTHONUNBUFFERED=1
for v in old new; do
  site=/tmp/yrsite; extra=""; [ $v = old ] && site=/tmp/yrsite_old && extra="--no-torch-compile"
  export PYTHONPATH=$site YIRAGE_CACHE_DIR=/tmp/yc-$v
  python3 -c "import yirage_triton; print('$v', yirage_triton.CODEGEN_VERSION)"
  B="python3 -m yirage.cli bench --backend cuda --no-plot --append --out $OUT/$v $extra --workloads rmsnorm_linear"
  $B --shapes gpu > $OUT/$v.log 2>&1
  $B --shapes ragged >> $OUT/$v.log 2>&1
  $B --shapes gpu --dims b=24 h=3000 n=7000 --dtype bfloat16 >> $OUT/$v.log 2>&1
  $B --shapes gpu --dims b=64 h=2048 n=3000 >> $OUT/$v.log 2>&1
  $B --shapes prefill_256 >> $OUT/$v.log 2>&1
  python3 .whl/summ.py $OUT/$v/*/results.json 2>&1 | grep -E "^==|->" | head -60 > $OUT/$v.summ
  grep "^==" $OUT/$v.summ
done
