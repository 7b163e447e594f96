-- Argo CD health of a MailCluster (mailcluster.dev/v1alpha1), read from what the
-- operator writes: status.observedGeneration and the conditions Ready, Progressing,
-- Degraded and SLOMet.
--   Suspended   spec.paused: the operator leaves every child object alone.
--   Progressing no status yet, or status of an older generation (the operator has
--               not looked at the latest change), or a rollout / schema migration
--               in motion, or no ready pods yet.
--   Degraded    the operator says so: invalid spec, missing Secret, failed migration,
--               mail pods refused for a sysctl of spec.tuning,
--               connection budget capped below what the spec asks for.
--   Healthy     Ready; a missed SLO of the last stress run shows in the message
--               but does not make the cluster unhealthy (it is still serving).
-- Only the base library is used (no string/os): Argo CD runs health scripts in a
-- restricted Lua 5.1 VM.
local hs = {}

local function find(conditions, kind)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(c)
  local reason = c.reason or c.type
  if c.message ~= nil and c.message ~= "" then
    return reason .. ": " .. c.message
  end
  return reason
end

if obj.spec ~= nil and obj.spec.paused == true then
  hs.status = "Suspended"
  hs.message = "spec.paused is true: the operator changes no child object"
  return hs
end

local status = obj.status
if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
    .. " (status is of generation " .. status.observedGeneration .. ")"
  return hs
end

local degraded = find(status.conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded)
  return hs
end

local progressing = find(status.conditions, "Progressing")
if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(progressing)
  return hs
end

local ready = find(status.conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready)
  local slo = find(status.conditions, "SLOMet")
  if slo ~= nil and slo.status == "False" then
    hs.message = hs.message .. "; last stress run: " .. describe(slo)
  end
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = describe(ready)
else
  hs.message = "Waiting for the Ready condition"
end
return hs
