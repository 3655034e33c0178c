-- Runs an Argo CD health script as Argo CD does (a chunk with the object in the global
-- `obj`, returning {status, message}) on each StatefulSet of a JSON file: one object or
-- a List (`kubectl get sts -o json`). Prints one tab-separated line per object:
-- namespace/name, status, held (the partition-target annotation) or free, message.
-- usage: lua5.4 health.lua SCRIPT FILE...
local cjson = require "cjson"
local script = arg[1]
if script == nil or arg[2] == nil then
  io.stderr:write("usage: lua5.4 health.lua SCRIPT FILE...\n")
  os.exit(2)
end
for i = 2, #arg do
  local f = assert(io.open(arg[i], "r"))
  local doc = cjson.decode(f:read("a"))
  f:close()
  local items = doc.items or { doc }
  if #items == 0 then
    io.stderr:write(arg[i] .. ": no object\n")
    os.exit(1)
  end
  for _, item in ipairs(items) do
    -- A fresh environment per object, as Argo CD gives each evaluation its own state.
    local env = setmetatable({ obj = item }, { __index = _G })
    local chunk = assert(loadfile(script, "t", env))
    local hs = chunk()
    if type(hs) ~= "table" or hs.status == nil then
      io.stderr:write(arg[i] .. ": the script returned no status\n")
      os.exit(1)
    end
    local meta = item.metadata or {}
    local held = (meta.annotations or {})["churn-throttler.io/partition-target"] and "held" or "free"
    print(string.format("%s/%s\t%s\t%s\t%s", meta.namespace or "", meta.name or "", hs.status, held, hs.message or ""))
  end
end
