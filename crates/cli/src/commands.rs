//! Running the commands: the I/O around the pure parts (reading, rendering, patches).

use std::collections::BTreeMap;
use std::time::Duration;

use automanager_api as api;
use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::actions::{self, Step};
use crate::connect::Target;
use crate::error::CliError;
use crate::operator::{OperatorClient, OperatorEndpoint};
use crate::progress::Progress;
use crate::render::{self, trace::TraceView};
use crate::{Cli, Command, GetWhat, GlobalArgs, Output, TopWhat, WaitArgs};

/// The field manager of every write the plugin makes.
pub const FIELD_MANAGER: &str = "kubectl-automanager";

/// Runs one command.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let g = &cli.global;
    match cli.command {
        Command::Validate { files, pools } => validate(g, &files, &pools),
        Command::WhatIf {
            file,
            from_operator,
        } => what_if(g, &file, from_operator).await,
        Command::Trace {
            bundle,
            replica,
            job,
            from_operator,
        } => {
            if from_operator || asks_the_operator(g) {
                trace(g, &bundle, replica, job).await
            } else {
                history(g, &bundle, replica, job).await
            }
        }
        Command::Top { what } => top(g, what).await,
        Command::Map { bundle, pool } => map(g, bundle.as_deref(), pool.as_deref()).await,
        Command::Get {
            what: GetWhat::Broken { all_namespaces },
        } => broken(g, all_namespaces).await,
        Command::Get {
            what:
                GetWhat::Windows {
                    bundle,
                    all_namespaces,
                },
        } => windows(g, bundle.as_deref(), all_namespaces).await,
        Command::Cordon { node } => cordon(g, &node, true).await,
        Command::Uncordon { node } => cordon(g, &node, false).await,
        Command::Drain { node, mode, wait } => drain(g, &node, mode.to_api(), &wait).await,
        Command::Migrate {
            job,
            to,
            strategy,
            wait,
        } => migrate(g, &job, to.as_deref(), strategy.map(|s| s.to_api()), &wait).await,
        Command::Abort {
            migration,
            reason,
            wait,
        } => abort(g, &migration, &reason, &wait).await,
        Command::Retry { bundle, wait } => retry(g, &bundle, &wait).await,
        Command::Completion { shell } => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(
                shell,
                &mut cmd,
                "kubectl-automanager",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Output

fn print_data<T: Serialize>(out: &Output, value: &T, names: &[String]) -> Result<(), CliError> {
    let text = match out {
        Output::Yaml => {
            serde_saphyr::to_string(value).map_err(|e| CliError::Output(e.to_string()))?
        }
        Output::Name => names.iter().map(|n| format!("{n}\n")).collect(),
        Output::JsonPath(template) => {
            let data = serde_json::to_value(value).map_err(|e| CliError::Output(e.to_string()))?;
            crate::jsonpath::Template::parse(template)
                .and_then(|t| t.render(&data))
                .map_err(CliError::Output)?
        }
        _ => {
            let mut s =
                serde_json::to_string_pretty(value).map_err(|e| CliError::Output(e.to_string()))?;
            s.push('\n');
            s
        }
    };
    write_out(&text)
}

/// `kind/name` of an object (for `-o name`), from its own `kind` and `metadata.name`.
fn object_name<T: Serialize>(obj: &T) -> Vec<String> {
    names_of(&serde_json::to_value(obj).unwrap_or_default(), "")
}

/// `kind/name` of each object or row in `value`: an object's own kind and name, or a row's
/// `name`/`bundle` under `kind`.
fn names_of(value: &serde_json::Value, kind: &str) -> Vec<String> {
    match value {
        serde_json::Value::Array(items) => items.iter().flat_map(|v| names_of(v, kind)).collect(),
        serde_json::Value::Object(map) => {
            if let Some(name) = value["metadata"]["name"].as_str() {
                let k = map
                    .get("kind")
                    .and_then(|k| k.as_str())
                    .map(str::to_ascii_lowercase)
                    .unwrap_or_else(|| kind.to_owned());
                return vec![format!("{k}/{name}")];
            }
            ["name", "bundle"]
                .iter()
                .find_map(|k| map.get(*k).and_then(|v| v.as_str()))
                .map(|n| {
                    // A row's bundle may be `namespace/name`.
                    let n = n.rsplit('/').next().unwrap_or(n);
                    vec![format!("{kind}/{n}")]
                })
                .unwrap_or_default()
        }
        _ => Vec::new(),
    }
}

fn report_names(report: &crate::validate::Report) -> Vec<String> {
    report
        .objects
        .iter()
        .map(|o| format!("{}/{}", o.kind.to_ascii_lowercase(), o.name))
        .collect()
}

/// With `--verbose`, says on standard error how the operator answered.
fn say_route(g: &GlobalArgs, client: &OperatorClient) -> Result<(), CliError> {
    if !g.verbose {
        return Ok(());
    }
    use std::io::Write;
    let route = client.route();
    let line = match route.pod {
        Some(pod) => format!(
            "operator: answered by pod {}/{pod} through={}\n",
            g.operator_namespace, route.through
        ),
        None => format!("operator: answered through={}\n", route.through),
    };
    std::io::stderr().lock().write_all(line.as_bytes())?;
    Ok(())
}

/// Writes `text` to standard output. A reader that went away (`| head`) ends the command
/// quietly ([`CliError::OutputClosed`]) instead of the panic `print!` would raise.
fn write_out(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The cluster

struct Cluster {
    client: kube::Client,
    namespace: String,
    config: kube::Config,
    /// The apiserver and context, for messages.
    target: Target,
}

impl Cluster {
    /// A client for the operator's debugging API through the apiserver, without kube's default
    /// retry of 429/503/504: through the service proxy those are the answer (a standby's 503
    /// naming the leader, the proxy's "no endpoints available"), and retrying them with
    /// kube's backoff only turns them into a wait until --request-timeout.
    fn operator_client(&self) -> Result<kube::Client, CliError> {
        let mut config = self.config.clone();
        config.default_retry = false;
        crate::connect::client_of(config, &self.target)
    }

    /// A failed call as a message naming this apiserver and context.
    fn err(&self) -> impl Fn(kube::Error) -> CliError + '_ {
        |e| crate::connect::api_error(&self.target, e)
    }
}

async fn cluster(g: &GlobalArgs) -> Result<Cluster, CliError> {
    let conn = crate::connect::load(g).await?;
    let namespace = g
        .namespace
        .clone()
        .unwrap_or_else(|| conn.config.default_namespace.clone());
    let client = conn.client()?;
    Ok(Cluster {
        client,
        namespace,
        config: conn.config,
        target: conn.target,
    })
}

fn endpoint(g: &GlobalArgs) -> OperatorEndpoint {
    match (&g.operator_url, &g.operator_service) {
        (Some(url), _) => OperatorEndpoint::Direct(url.clone()),
        (None, Some(service)) => OperatorEndpoint::ServiceProxy {
            namespace: g.operator_namespace.clone(),
            service: service.clone(),
            port: g.operator_port.clone(),
        },
        (None, None) => OperatorEndpoint::Leader {
            namespace: g.operator_namespace.clone(),
            release: g.operator_release.clone(),
            selector: g.operator_selector.clone(),
        },
    }
}

async fn get_opt<K>(target: &Target, api: &Api<K>, name: &str) -> Result<Option<K>, CliError>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .map_err(|e| crate::connect::api_error(target, e))
}

async fn list<K>(target: &Target, api: &Api<K>) -> Result<Vec<K>, CliError>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    // From the apiserver's watch cache: a moment stale at most, and fast on big clusters.
    api.list(&ListParams::default().match_any())
        .await
        .map(|l| l.items)
        .map_err(|e| crate::connect::api_error(target, e))
}

async fn bundle(c: &Cluster, name: &str) -> Result<api::Bundle, CliError> {
    let bundles: Api<api::Bundle> = Api::namespaced(c.client.clone(), &c.namespace);
    get_opt(&c.target, &bundles, name)
        .await?
        .ok_or_else(|| CliError::NotFound {
            kind: "bundle",
            name: format!("{}/{name}", c.namespace),
            hint: " (kubectl get bundles -A lists them)".into(),
        })
}

/// How long a write waits for the ManagerNode of a node a bundle already names: longer than
/// the operator takes to write an object again after it was deleted by hand (its sweep runs
/// every 30 s).
const MIRROR_WAIT: Duration = Duration::from_secs(60);
/// How often it looks again meanwhile.
const MIRROR_POLL: Duration = Duration::from_millis(250);

/// The ManagerNode called `name`, or the one of Manager's node id `name`. The operator mirrors
/// a node into its object a moment after Manager reports it, so a node a bundle's status
/// already names may have none yet: then this says so and waits for it (at most
/// [`MIRROR_WAIT`]), as `kubectl wait` would; a name nothing knows is not found at once.
async fn manager_node(c: &Cluster, name: &str) -> Result<api::ManagerNode, CliError> {
    if let Some(n) = find_manager_node(c, name).await? {
        return Ok(n);
    }
    let named_by = expecting_node(c, name).await;
    let Some(first) = named_by.first() else {
        return Err(CliError::NotFound {
            kind: "managernode",
            name: name.to_owned(),
            hint: " (kubectl automanager top nodes lists them)".into(),
        });
    };
    {
        use std::io::Write;
        let line = format!(
            "managernode {name}: still being mirrored (bundle {first} runs a job there); waiting up to {}s\n",
            MIRROR_WAIT.as_secs()
        );
        std::io::stderr().lock().write_all(line.as_bytes())?;
    }
    let deadline = tokio::time::Instant::now() + MIRROR_WAIT;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(MIRROR_POLL).await;
        if let Some(n) = find_manager_node(c, name).await? {
            return Ok(n);
        }
    }
    Err(CliError::NotFound {
        kind: "managernode",
        name: name.to_owned(),
        hint: format!(
            " (bundle {first} names the node, but the operator did not mirror it within {}s: is it running? kubectl automanager top nodes lists the nodes)",
            MIRROR_WAIT.as_secs()
        ),
    })
}

async fn find_manager_node(c: &Cluster, name: &str) -> Result<Option<api::ManagerNode>, CliError> {
    let nodes: Api<api::ManagerNode> = Api::all(c.client.clone());
    if let Some(n) = get_opt(&c.target, &nodes, name).await? {
        return Ok(Some(n));
    }
    let object_name = crate::engine::node_object_name(name);
    if object_name != name {
        return get_opt(&c.target, &nodes, &object_name).await;
    }
    Ok(None)
}

/// The bundles whose status names Manager's node `name`: in every namespace when the user may
/// list them there, else in the current one; none when neither is allowed.
async fn expecting_node(c: &Cluster, name: &str) -> Vec<String> {
    let all: Api<api::Bundle> = Api::all(c.client.clone());
    let bundles = match list(&c.target, &all).await {
        Ok(b) => b,
        Err(_) => {
            let here: Api<api::Bundle> = Api::namespaced(c.client.clone(), &c.namespace);
            list(&c.target, &here).await.unwrap_or_default()
        }
    };
    actions::bundles_naming(&bundles, name)
}

async fn packing(c: &Cluster) -> BTreeMap<String, String> {
    let pools: Api<api::PlacementPool> = Api::all(c.client.clone());
    list(&c.target, &pools)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let packing = match p.spec.packing_strategy {
                api::PackingStrategy::Binpack => "binpack",
                api::PackingStrategy::Spread => "spread",
            };
            (p.metadata.name.unwrap_or_default(), packing.to_owned())
        })
        .collect()
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

// ---------------------------------------------------------------------------------------------
// validate, what-if, trace

fn validate(
    g: &GlobalArgs,
    files: &[std::path::PathBuf],
    pools: &[std::path::PathBuf],
) -> Result<(), CliError> {
    let objects = crate::input::read_objects(files)?;
    let pool_objects = crate::input::read_objects(pools)?;
    let schemas = crate::schema::Schemas::load().map_err(CliError::Input)?;
    let namespace = g.namespace.as_deref().unwrap_or("default");
    let report = crate::validate::validate(&objects, &pool_objects, namespace, &schemas);
    if g.output.is_data() {
        print_data(&g.output, &report, &report_names(&report))?;
    } else {
        write_out(&render::validate::render(&report))?;
    }
    if report.valid {
        Ok(())
    } else {
        let n = report.objects.iter().filter(|o| !o.valid).count();
        Err(CliError::Refused(format!(
            "{n} invalid object{}",
            if n == 1 { "" } else { "s" }
        )))
    }
}

/// Whether the user pointed the plugin at the operator itself (its URL or a Service over its
/// debugging port): trace and what-if then ask it, as `--from-operator` does.
fn asks_the_operator(g: &GlobalArgs) -> bool {
    g.operator_url.is_some() || g.operator_service.is_some()
}

async fn what_if(
    g: &GlobalArgs,
    file: &std::path::Path,
    from_operator: bool,
) -> Result<(), CliError> {
    let objects = crate::input::read_objects(&[file.to_path_buf()])?;
    let bundles: Vec<_> = objects.iter().filter(|o| o.kind() == "Bundle").collect();
    let [obj] = bundles.as_slice() else {
        return Err(CliError::Input(format!(
            "what-if takes exactly one Bundle; {} holds {}",
            file.display(),
            bundles.len()
        )));
    };
    let spec: api::Bundle =
        serde_json::from_value(obj.value.clone()).map_err(|e| CliError::Parse {
            path: file.to_path_buf(),
            message: format!(
                "not a Bundle: {e} (kubectl automanager validate -f shows every problem)"
            ),
        })?;
    if !(from_operator || asks_the_operator(g)) {
        return what_if_here(g, obj, &spec).await;
    }
    let endpoint = endpoint(g);
    let cluster = match (&endpoint, cluster(g).await) {
        (_, Ok(c)) => Some(c),
        (OperatorEndpoint::Direct(_), Err(_)) => None,
        (_, Err(e)) => return Err(e),
    };
    let namespace = obj
        .namespace()
        .map(str::to_owned)
        .or_else(|| cluster.as_ref().map(|c| c.namespace.clone()))
        .unwrap_or_else(|| "default".into());
    let mut body = obj.value.clone();
    body["metadata"]["namespace"] = serde_json::Value::String(namespace.clone());
    let mut client = OperatorClient::new(
        endpoint,
        cluster.as_ref().map(Cluster::operator_client).transpose()?,
        g.request_timeout.0,
    );
    if let Some(c) = &cluster {
        client = client.via_apiserver(c.target.clone());
    }
    let raw = client.what_if(&body).await?;
    say_route(g, &client)?;
    let answer: render::whatif::WhatIf =
        serde_json::from_value(raw.clone()).map_err(|e| CliError::Operator {
            status: 200,
            message: format!("an answer this plugin does not understand ({e}): {raw}"),
        })?;
    show_what_if(g, obj, &spec, &namespace, &answer, &raw, cluster.as_ref()).await
}

/// Shows a what-if answer (`data` as it came, or rendered with the pools' packing when the
/// cluster is at hand) and refuses when the bundle would not be admitted now.
async fn show_what_if(
    g: &GlobalArgs,
    obj: &crate::input::SourceObject,
    spec: &api::Bundle,
    namespace: &str,
    answer: &render::whatif::WhatIf,
    data: &impl serde::Serialize,
    cluster: Option<&Cluster>,
) -> Result<(), CliError> {
    if g.output.is_data() {
        print_data(&g.output, data, &[format!("bundle/{}", obj.name())])?;
    } else {
        let view = TraceView {
            packing: match cluster {
                Some(c) => packing(c).await,
                None => BTreeMap::new(),
            },
            wide: g.output == Output::Wide,
            ..TraceView::default()
        };
        let name = format!("{namespace}/{}", obj.name());
        write_out(&render::whatif::render(&name, answer, &spec.spec, &view))?;
    }
    if answer.fits() {
        Ok(())
    } else {
        Err(CliError::Refused(format!(
            "bundle {namespace}/{} would not be admitted now",
            obj.name()
        )))
    }
}

/// `what-if` computed here: the operator's engine on the pools and nodes the apiserver holds
/// ([`crate::dry_run`]).
async fn what_if_here(
    g: &GlobalArgs,
    obj: &crate::input::SourceObject,
    spec: &api::Bundle,
) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let namespace = obj
        .namespace()
        .map(str::to_owned)
        .unwrap_or_else(|| c.namespace.clone());
    let pools: Api<api::PlacementPool> = Api::all(c.client.clone());
    let nodes: Api<api::ManagerNode> = Api::all(c.client.clone());
    let (pools, nodes) = futures::try_join!(list(&c.target, &pools), list(&c.target, &nodes))?;
    let now = chrono::Utc::now();
    let engine_bundle = crate::engine::bundle(&namespace, obj.name(), &spec.spec);
    let (result, decisions) = crate::dry_run::what_if(
        &engine_bundle,
        crate::dry_run::snapshot(&pools, &nodes, now),
        now,
    );
    let answer = render::whatif::WhatIf { result, decisions };
    show_what_if(g, obj, spec, &namespace, &answer, &answer, Some(&c)).await
}

/// `trace` from the bundle's PlacementHistory, which the apiserver keeps: any operator replica
/// wrote it, and it outlives restarts and failovers.
async fn history(
    g: &GlobalArgs,
    name: &str,
    replica: Option<u32>,
    job: Option<String>,
) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let b = bundle(&c, name).await?;
    let api: Api<api::PlacementHistory> = Api::namespaced(c.client.clone(), &c.namespace);
    let Some(found) = get_opt(&c.target, &api, name).await? else {
        let phase = phase_of(&b);
        return Err(CliError::NotFound {
            kind: "placement history of bundle",
            name: format!("{}/{name}", c.namespace),
            hint: format!(
                " (phase {phase}): the operator writes it when it makes a placement decision for the bundle; none has been made yet"
            ),
        });
    };
    let mut view = TraceView {
        replica,
        job,
        wide: g.output == Output::Wide,
        ..TraceView::default()
    };
    let shown = render::history::filtered(&found, &c.namespace, &view).map_err(CliError::Input)?;
    if g.output.is_data() {
        return print_data(&g.output, &shown, &[format!("placementhistory/{name}")]);
    }
    view.packing = packing(&c).await;
    write_out(&render::history::render(&shown, &c.namespace, &view))?;
    Ok(())
}

/// A Bundle's phase as the "not found" hints show it.
fn phase_of(b: &api::Bundle) -> String {
    b.status
        .as_ref()
        .map(|s| format!("{:?}", s.phase))
        .unwrap_or_else(|| "no status yet".into())
}

async fn trace(
    g: &GlobalArgs,
    name: &str,
    replica: Option<u32>,
    job: Option<String>,
) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let b = bundle(&c, name).await?;
    let client = OperatorClient::new(endpoint(g), Some(c.operator_client()?), g.request_timeout.0)
        .via_apiserver(c.target.clone());
    let found = client.trace(&c.namespace, name).await?;
    say_route(g, &client)?;
    let Some(raw) = found else {
        let phase = phase_of(&b);
        return Err(CliError::NotFound {
            kind: "placement trace of bundle",
            name: format!("{}/{name}", c.namespace),
            hint: format!(
                " (phase {phase}): the operator keeps the full trace of the decisions it made since it started; the bounded summary of the last one is in the Bundle's status.replicas[].jobs[].lastPlacement"
            ),
        });
    };
    let full: render::trace::BundleTrace =
        serde_json::from_value(raw).map_err(|e| CliError::Operator {
            status: 200,
            message: format!("a trace this plugin does not understand: {e}"),
        })?;
    let mut view = TraceView {
        replica,
        job,
        wide: g.output == Output::Wide,
        ..TraceView::default()
    };
    let shown = full.filtered(&view).map_err(CliError::Input)?;
    if g.output.is_data() {
        return print_data(&g.output, &shown, &[format!("bundle/{name}")]);
    }
    view.packing = packing(&c).await;
    write_out(&render::trace::render(&shown, &view))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// top, get broken, get windows

async fn top(g: &GlobalArgs, what: TopWhat) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let wide = g.output == Output::Wide;
    match what {
        TopWhat::Nodes { pool } => {
            let rows = node_rows(&c, pool.as_deref()).await?;
            if g.output.is_data() {
                let names: Vec<String> = rows
                    .iter()
                    .map(|r| format!("managernode/{}", r.node))
                    .collect();
                print_data(&g.output, &rows, &names)
            } else {
                write_out(&render::top::render_nodes(&rows, wide))
            }
        }
        TopWhat::Pools => {
            let pools: Api<api::PlacementPool> = Api::all(c.client.clone());
            let (pools, nodes) = futures::try_join!(list(&c.target, &pools), node_rows(&c, None))?;
            let rows = render::top::pool_rows(&pools, &nodes);
            if g.output.is_data() {
                let names: Vec<String> = rows
                    .iter()
                    .map(|r| format!("placementpool/{}", r.pool))
                    .collect();
                print_data(&g.output, &rows, &names)
            } else {
                write_out(&render::top::render_pools(&rows, wide))
            }
        }
    }
}

/// Every ManagerNode's row, as the apiserver's Table of the CRD's printer columns: a few
/// hundred bytes a node where the objects carry their job lists (at 2,000 nodes the list of
/// objects took the apiserver over a second to encode). Falls back to the objects when the
/// answer is not a Table.
async fn node_rows(c: &Cluster, pool: Option<&str>) -> Result<Vec<render::top::NodeRow>, CliError> {
    use kube::Resource;
    // From the apiserver's watch cache, like `list`.
    let url = format!(
        "{}?resourceVersion=0&includeObject=None",
        api::ManagerNode::url_path(&(), None)
    );
    let request = http::Request::get(url)
        .header(
            http::header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Vec::new())
        .map_err(|e| CliError::Api(e.to_string()))?;
    let table: serde_json::Value = c.client.request(request).await.map_err(c.err())?;
    if let Some(rows) = render::top::node_rows_from_table(&table, pool) {
        return Ok(rows);
    }
    let nodes: Api<api::ManagerNode> = Api::all(c.client.clone());
    Ok(render::top::node_rows(
        &list(&c.target, &nodes).await?,
        pool,
    ))
}

async fn map(g: &GlobalArgs, bundle: Option<&str>, pool: Option<&str>) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let pools: Api<api::PlacementPool> = Api::all(c.client.clone());
    let nodes: Api<api::ManagerNode> = Api::all(c.client.clone());
    let highlight = match bundle {
        Some(b) if b.contains('/') => Some(b.to_owned()),
        Some(b) => {
            // Said as kubectl names objects: in --namespace; it must exist.
            self::bundle(&c, b).await?;
            Some(format!("{}/{b}", c.namespace))
        }
        None => None,
    };
    let (pools, nodes) = futures::try_join!(list(&c.target, &pools), list(&c.target, &nodes))?;
    let m = crate::map::build(&nodes, &pools, pool, highlight.as_deref());
    if g.output.is_data() {
        let names: Vec<String> = m
            .pools
            .iter()
            .flat_map(|p| &p.zones)
            .flat_map(|z| &z.nodes)
            .map(|n| format!("managernode/{}", n.node))
            .collect();
        print_data(&g.output, &m, &names)
    } else {
        write_out(&crate::map::render(&m))
    }
}

async fn broken(g: &GlobalArgs, all_namespaces: bool) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let api: Api<api::Bundle> = if all_namespaces {
        Api::all(c.client.clone())
    } else {
        Api::namespaced(c.client.clone(), &c.namespace)
    };
    let rows = render::broken::rows(&list(&c.target, &api).await?);
    if g.output.is_data() {
        let names = names_of(&serde_json::to_value(&rows).unwrap_or_default(), "bundle");
        print_data(&g.output, &rows, &names)
    } else {
        write_out(&render::broken::render(&rows, chrono::Utc::now()))
    }
}

async fn windows(
    g: &GlobalArgs,
    bundle: Option<&str>,
    all_namespaces: bool,
) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let (bundles, migrations): (Api<api::Bundle>, Api<api::Migration>) = if all_namespaces {
        (Api::all(c.client.clone()), Api::all(c.client.clone()))
    } else {
        (
            Api::namespaced(c.client.clone(), &c.namespace),
            Api::namespaced(c.client.clone(), &c.namespace),
        )
    };
    let bundles = match bundle {
        Some(name) => vec![self::bundle(&c, name).await?],
        None => list(&c.target, &bundles).await?,
    };
    let view = render::windows::view(
        &bundles,
        &list(&c.target, &migrations).await?,
        chrono::Utc::now(),
    );
    if g.output.is_data() {
        let mut names = names_of(
            &serde_json::to_value(&view.rows).unwrap_or_default(),
            "bundle",
        );
        names.dedup();
        print_data(&g.output, &view, &names)
    } else {
        write_out(&render::windows::render(&view))
    }
}

// ---------------------------------------------------------------------------------------------
// Writes

async fn cordon(g: &GlobalArgs, node: &str, cordoned: bool) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let n = manager_node(&c, node).await?;
    let name = n.metadata.name.clone().unwrap_or_default();
    let verb = if cordoned { "cordoned" } else { "uncordoned" };
    let node = if n.spec.cordoned == cordoned {
        if !g.output.is_data() {
            write_out(&format!("managernode/{name} already {verb}\n"))?;
        }
        n
    } else {
        let api: Api<api::ManagerNode> = Api::all(c.client.clone());
        let n = api
            .patch(
                &name,
                &patch_params(),
                &Patch::Merge(actions::cordon_patch(cordoned)),
            )
            .await
            .map_err(c.err())?;
        if !g.output.is_data() {
            write_out(&format!("managernode/{name} {verb}\n"))?;
        }
        n
    };
    if g.output.is_data() {
        print_data(&g.output, &node, &[format!("managernode/{name}")])?;
    }
    Ok(())
}

async fn drain(
    g: &GlobalArgs,
    node: &str,
    mode: api::DrainMode,
    wait: &WaitArgs,
) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let n = manager_node(&c, node).await?;
    let name = n.metadata.name.clone().unwrap_or_default();
    let api: Api<api::ManagerNode> = Api::all(c.client.clone());
    let mode_name = match mode {
        api::DrainMode::Migrate => "migrate",
        api::DrainMode::Terminate => "terminate",
    };
    let (n, line) = match n.spec.drain {
        Some(d) if d.mode == mode => (
            n,
            format!("managernode/{name} already draining (mode {mode_name})"),
        ),
        _ => (
            api.patch(
                &name,
                &patch_params(),
                &Patch::Merge(actions::drain_patch(mode)),
            )
            .await
            .map_err(c.err())?,
            format!("managernode/{name} draining (mode {mode_name})"),
        ),
    };
    if !written(&g.output, &line, &n, wait)? {
        return Ok(());
    }
    let mut last = None;
    let fin = follow(
        &api,
        &name,
        wait,
        &g.output,
        format!("the drain of managernode/{name}"),
        |obj| actions::drain_step(obj, &mut last),
    )
    .await?;
    finish(
        &g.output,
        fin.as_ref(),
        &format!("managernode/{name} drained"),
    )
}

async fn migrate(
    g: &GlobalArgs,
    job: &str,
    to: Option<&str>,
    strategy: Option<api::MigrationStrategy>,
    wait: &WaitArgs,
) -> Result<(), CliError> {
    let job = actions::parse_job_ref(job).map_err(CliError::Input)?;
    let c = cluster(g).await?;
    let b = bundle(&c, &job.bundle).await?;
    if job.replica >= b.spec.replicas {
        return Err(CliError::Input(format!(
            "bundle {}/{} has {} replica{} (0 to {}); there is no replica {}",
            c.namespace,
            job.bundle,
            b.spec.replicas,
            if b.spec.replicas == 1 { "" } else { "s" },
            b.spec.replicas - 1,
            job.replica
        )));
    }
    if !b.spec.jobs.iter().any(|j| j.job_name == job.job) {
        let names: Vec<&str> = b.spec.jobs.iter().map(|j| j.job_name.as_str()).collect();
        return Err(CliError::Input(format!(
            "bundle {}/{} has no job {:?} (its jobs: {})",
            c.namespace,
            job.bundle,
            job.job,
            names.join(", ")
        )));
    }
    let api: Api<api::Migration> = Api::namespaced(c.client.clone(), &c.namespace);
    let m = actions::migration(&c.namespace, &job, to, strategy);
    let created = api
        .create(
            &PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            },
            &m,
        )
        .await
        .map_err(c.err())?;
    let name = created.metadata.name.clone().unwrap_or_default();
    if !written(
        &g.output,
        &format!("migration/{name} created"),
        &created,
        wait,
    )? {
        return Ok(());
    }
    let mut seen = 0;
    let fin = follow(
        &api,
        &name,
        wait,
        &g.output,
        format!("migration {}/{name}", c.namespace),
        |obj| match obj {
            Some(m) => actions::migration_step(m, &mut seen),
            None => gone("migration"),
        },
    )
    .await?;
    finish(
        &g.output,
        fin.as_ref(),
        &format!("migration/{name} completed"),
    )
}

async fn abort(g: &GlobalArgs, name: &str, reason: &str, wait: &WaitArgs) -> Result<(), CliError> {
    let c = cluster(g).await?;
    let api: Api<api::Migration> = Api::namespaced(c.client.clone(), &c.namespace);
    let m = get_opt(&c.target, &api, name)
        .await?
        .ok_or_else(|| CliError::NotFound {
            kind: "migration",
            name: format!("{}/{name}", c.namespace),
            hint: " (kubectl get migrations lists them)".into(),
        })?;
    let phase = m.status.as_ref().map(|s| s.phase).unwrap_or_default();
    use api::MigrationPhase as P;
    if matches!(
        phase,
        P::Completed | P::Aborted | P::Refused | P::Rejected | P::Failed
    ) {
        return Err(CliError::Refused(format!(
            "migration {}/{name} already ended ({phase:?}); there is nothing to abort",
            c.namespace
        )));
    }
    let m = match &m.spec.abort {
        Some(_) => m,
        None => api
            .patch(
                name,
                &patch_params(),
                &Patch::Merge(actions::abort_patch(reason)),
            )
            .await
            .map_err(c.err())?,
    };
    if !written(
        &g.output,
        &format!("migration/{name} abort requested"),
        &m,
        wait,
    )? {
        return Ok(());
    }
    let mut seen = 0;
    let fin = follow(
        &api,
        name,
        wait,
        &g.output,
        format!("migration {}/{name} to stop", c.namespace),
        |obj| match obj {
            Some(m) => {
                let mut s = actions::migration_step(m, &mut seen);
                // For an abort, Aborted is the good end and Completed the refusal.
                let phase = m.status.as_ref().map(|s| s.phase).unwrap_or_default();
                match phase {
                    P::Aborted => {
                        s.done = Some(true);
                        s.failure = None;
                    }
                    P::Completed => {
                        s.done = Some(false);
                        s.failure = Some(
                            "the migration completed: it was past its point of no return when the abort came".into(),
                        );
                    }
                    _ => {}
                }
                s
            }
            None => Step {
                events: vec![],
                status: "deleted".into(),
                done: Some(true),
                failure: None,
            },
        },
    )
    .await?;
    finish(
        &g.output,
        fin.as_ref(),
        &format!("migration/{name} aborted"),
    )
}

async fn retry(g: &GlobalArgs, name: &str, wait: &WaitArgs) -> Result<(), CliError> {
    let c = cluster(g).await?;
    bundle(&c, name).await?;
    let api: Api<api::Bundle> = Api::namespaced(c.client.clone(), &c.namespace);
    let value = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let b = api
        .patch(
            name,
            &patch_params(),
            &Patch::Merge(actions::retry_patch(&value)),
        )
        .await
        .map_err(c.err())?;
    let line = format!(
        "bundle/{name} retry requested ({}={value})",
        api::RETRY_ANNOTATION
    );
    if !written(&g.output, &line, &b, wait)? {
        return Ok(());
    }
    let mut last = None;
    let fin = follow(
        &api,
        name,
        wait,
        &g.output,
        format!("bundle {}/{name} to be Ready", c.namespace),
        |obj| match obj {
            Some(b) => actions::retry_step(b, &value, &mut last),
            None => gone("bundle"),
        },
    )
    .await?;
    finish(&g.output, fin.as_ref(), &format!("bundle/{name} Ready"))
}

/// Says what was written; without `--wait` that is the whole answer (the object, for `-o
/// json|yaml`). Returns whether to follow the change.
fn written<T: Serialize>(
    out: &Output,
    line: &str,
    obj: &T,
    wait: &WaitArgs,
) -> Result<bool, CliError> {
    if !out.is_data() {
        write_out(&format!("{line}\n"))?;
    }
    if wait.wait {
        return Ok(true);
    }
    if out.is_data() {
        print_data(out, obj, &object_name(obj))?;
    }
    Ok(false)
}

fn gone(kind: &str) -> Step {
    Step {
        events: vec![],
        status: format!("the {kind} was deleted"),
        done: Some(false),
        failure: Some(format!("the {kind} was deleted while waiting")),
    }
}

fn finish<T: Serialize>(out: &Output, obj: Option<&T>, done: &str) -> Result<(), CliError> {
    if out.is_data() {
        match obj {
            Some(o) => print_data(out, o, &object_name(o)),
            None => print_data(out, &serde_json::Value::Null, &[]),
        }
    } else {
        write_out(&format!("{done}\n"))
    }
}

/// Follows one object until `step` says it is done, or `wait.timeout` passes.
async fn follow<K>(
    api: &Api<K>,
    name: &str,
    wait: &WaitArgs,
    out: &Output,
    what: String,
    mut step: impl FnMut(Option<&K>) -> Step,
) -> Result<Option<K>, CliError>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut progress = Progress::stdio(out.is_data());
    let deadline = tokio::time::Instant::now() + wait.timeout;
    let mut stream = kube::runtime::watcher::watch_object(api.clone(), name).boxed();
    let mut last_status: Option<String> = None;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        let next = tokio::select! {
            n = stream.next() => n,
            _ = tick.tick() => {
                // Keeps a terminal's elapsed time moving while nothing changes.
                if let Some(s) = &last_status { progress.status(s); }
                continue;
            }
            _ = tokio::time::sleep_until(deadline) => {
                progress.finish();
                return Err(CliError::Timeout { what, after: wait.timeout, last: last_status });
            }
        };
        match next {
            Some(Ok(obj)) => {
                let s = step(obj.as_ref());
                for e in &s.events {
                    progress.event(e);
                }
                progress.status(&s.status);
                last_status = Some(s.status.clone());
                match s.done {
                    Some(true) => {
                        progress.finish();
                        return Ok(obj);
                    }
                    Some(false) => {
                        progress.finish();
                        return Err(CliError::Refused(
                            s.failure.unwrap_or_else(|| format!("{what} failed")),
                        ));
                    }
                    None => {}
                }
            }
            Some(Err(e)) => {
                // The watch restarts by itself; say so and keep waiting.
                progress.event(&format!("watch interrupted ({e}); resuming"));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            None => {
                progress.finish();
                return Err(CliError::Api(format!("the watch of {what} ended")));
            }
        }
    }
}
