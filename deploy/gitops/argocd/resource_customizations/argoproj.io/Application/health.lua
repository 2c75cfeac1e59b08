-- Argo CD health of an Argo CD Application as a resource of a parent Application (app of
-- apps). Argo CD 1.8 removed its built-in Application health check, so a parent no longer
-- waits for a child in an earlier sync wave to be healthy before it syncs the next wave; this
-- is the check Argo CD's documentation gives to restore that (docs/gitops.md): the child's own
-- health, Progressing until it has one.
hs = {}
hs.status = "Progressing"
hs.message = ""
if obj.status ~= nil then
  if obj.status.health ~= nil then
    hs.status = obj.status.health.status
    if obj.status.health.message ~= nil then
      hs.message = obj.status.health.message
    end
  end
end
return hs
