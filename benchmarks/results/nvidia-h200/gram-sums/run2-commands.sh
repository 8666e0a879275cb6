source .whl/setup.sh
B="python3 -m yirage.cli bench --backend cuda --no-plot --append --out $OUT/new2 --workloads rmsnorm_linear"
$B --shapes gpu > $OUT/new2.log 2>&1
$B --shapes ragged >> $OUT/new2.log 2>&1
$B --shapes gpu --dims b=24 h=3000 n=7000 --dtype bfloat16 >> $OUT/new2.log 2>&1
$B --shapes gpu --dims b=64 h=2048 n=3000 >> $OUT/new2.log 2>&1
python3 .whl/summ.py $OUT/new2/*/results.json 2>&1 | grep -E "^==|->" | head -60 > $OUT/new2.summ
grep "^==" $OUT/new2.summ | cut -c1-220
YIRAGE_REQUIRE_DEVICE=1 timeout 330 python3 -m pytest -m cuda tests/cuda tests/triton -q -x -p no:cacheprovider 2>&1 | tail -6 | tee $OUT/pytest_cuda.txt
