-- Argo CD health of an AutoManager object (Bundle, Migration, HotSpareTarget, PlacementPool,
-- ManagerNode), read from its kstatus conditions: Ready, Reconciling and Stalled, each kept by
-- the operator with observedGeneration (docs/kstatus.md).
--
--   Reconciling=True, or the operator has not seen the latest spec    -> Progressing
--   Stalled=True                                                       -> Degraded
--   Ready=True for a Migration aborted at the user's request           -> Suspended
--   Ready=True for a ManagerNode Manager stopped or terminated         -> Suspended
--   Ready=True otherwise                                               -> Healthy
--   being deleted, or no status yet                                    -> Progressing
--
-- Argo CD runs configured health scripts with only Lua's base and table libraries, so this
-- script uses nothing else.
local hs = {}

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "being deleted"
  return hs
end

local status = obj.status
if status == nil or status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the operator's first status"
  return hs
end

if obj.metadata.generation ~= nil and status.observedGeneration ~= nil
    and status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "the operator has not acted on generation " .. tostring(obj.metadata.generation) .. " yet"
  return hs
end

local conditions = {}
for _, c in ipairs(status.conditions) do
  conditions[c.type] = c
end

local function say(c)
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

local stalled = conditions["Stalled"]
local reconciling = conditions["Reconciling"]
local ready = conditions["Ready"]

if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = say(stalled)
elseif reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = say(reconciling)
elseif ready ~= nil and ready.status == "True" then
  -- Done as asked, but not the usual success: the job stayed where it was, the node is gone.
  if (obj.kind == "Migration" and status.phase == "Aborted")
      or (obj.kind == "ManagerNode" and (status.state == "stopped" or status.state == "terminated")) then
    hs.status = "Suspended"
  else
    hs.status = "Healthy"
  end
  hs.message = say(ready)
elseif ready ~= nil then
  hs.status = "Progressing"
  hs.message = say(ready)
else
  hs.status = "Progressing"
  hs.message = "waiting for the operator's conditions"
end
return hs
