-- binary-trees: build and check many short-lived binary trees while one
-- long-lived tree stays alive.  Every node is a table, so the interpreter
-- allocates and frees millions of small blocks (bench/run_real.py).
local function bottom_up(depth)
  if depth == 0 then return {} end
  depth = depth - 1
  return { bottom_up(depth), bottom_up(depth) }
end

local function check(tree)
  if tree[1] then return 1 + check(tree[1]) + check(tree[2]) end
  return 1
end

local n = tonumber(arg and arg[1]) or 14
local min_depth, max_depth = 4, math.max(4 + 2, n)

local stretch = max_depth + 1
io.write(string.format("stretch tree of depth %d\t check: %d\n", stretch, check(bottom_up(stretch))))

local long_lived = bottom_up(max_depth)
for depth = min_depth, max_depth, 2 do
  local iters = 2 ^ (max_depth - depth + min_depth)
  local sum = 0
  for _ = 1, iters do sum = sum + check(bottom_up(depth)) end
  io.write(string.format("%d\t trees of depth %d\t check: %d\n", iters, depth, sum))
end
io.write(string.format("long lived tree of depth %d\t check: %d\n", max_depth, check(long_lived)))
