-- Health of a MailDomain or MailAccount as Argo CD shows it: the Ready
-- condition the operator writes once it has observed the object's current
-- generation. Ready=False is Degraded with the operator's reason (a missing
-- Secret or domain, a password hash the server cannot verify).
local hs = {status = "Progressing", message = "Waiting for the operator to report status"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then
    if c.status == "True" then
      hs.status = "Healthy"
    elseif c.status == "False" then
      hs.status = "Degraded"
    end
    hs.message = tostring(c.reason) .. ": " .. tostring(c.message)
    return hs
  end
end
return hs
