-- Argo CD health of an automanager.norsk.io PlacementPool, read from the kstatus conditions the operator
-- keeps (Ready, Reconciling, Stalled, each with observedGeneration; docs/kstatus.md). Which
-- state maps to which health, and why, is in docs/gitops.md; health_test.yaml holds one
-- captured object per state. Checked by `tools/go-tool.sh argo-health` in its `test` mode.
-- The conditions mean what kstatus reads them as, so the script needs no reason of its own:
-- a Manager outage is Reconciling, jobs a band dropped on purpose leave a Bundle Ready.
--
--   Stalled (InvalidPool, UnknownToManager, KindMismatch)                      -> Degraded
--   Reconciling, a generation not acted on yet, no status yet, being deleted  -> Progressing
--   Ready                                                                     -> Healthy
-- Argo CD gives a configured health script only Lua's base, table and package libraries (no
-- string library), so this script uses nothing else. It runs on the live object as `obj`.
local hs = {}

-- "Reason: message", or the reason alone.
local function say(c)
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

local conditions = {}
if obj.status ~= nil and obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    conditions[c.type] = c
  end
end
local function holds(type_)
  local c = conditions[type_]
  if c ~= nil and c.status == "True" then
    return c
  end
  return nil
end
local stalled, reconciling, ready = holds("Stalled"), holds("Reconciling"), holds("Ready")

if obj.metadata.deletionTimestamp ~= nil then
  -- The finalizer's cleanup runs (or waits, and says why).
  hs.status = "Progressing"
  hs.message = "being deleted"
  local why = stalled or reconciling
  if why ~= nil then
    hs.message = hs.message .. "; " .. say(why)
  end
  return hs
end
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the operator's first status"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "the operator has not acted on generation " .. tostring(obj.metadata.generation) .. " yet"
  return hs
end
if stalled ~= nil then
  -- Only what a person must fix is Stalled; a Manager outage is Reconciling.
  hs.status = "Degraded"
  hs.message = say(stalled)
elseif reconciling ~= nil then
  hs.status = "Progressing"
  hs.message = say(reconciling)
elseif ready ~= nil then
  hs.status = "Healthy"
  hs.message = say(ready)
else
  hs.status = "Progressing"
  hs.message = "waiting for the operator's conditions"
end
return hs
