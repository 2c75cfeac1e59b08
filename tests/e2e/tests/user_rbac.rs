//! The ClusterRoles for users in deploy/rbac/user-roles.yaml (docs/user-rbac.md), on a real
//! apiserver: applied, bound as the doc says, and checked with `kubectl auth can-i` for what
//! each allows and refuses.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use automanager_e2e::{TestEnv, env_with_crds, repo_root};

/// `kubectl auth can-i VERB RESOURCE [-n NS]` as user `who` in group `group`.
async fn can(env: &TestEnv, who: &str, group: &str, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    let as_user = format!("--as={who}");
    let as_group = format!("--as-group={group}");
    all.push(&as_user);
    all.push(&as_group);
    let out = env.run_kubectl(&all).await.unwrap();
    match out.stdout.trim() {
        "yes" => true,
        "no" => false,
        other => panic!("kubectl {all:?}: {other} {}", out.stderr),
    }
}

async fn ok(env: &TestEnv, args: &[&str]) {
    let out = env.run_kubectl(args).await.unwrap();
    assert!(out.success(), "kubectl {args:?}: {}", out.stderr);
}

#[tokio::test]
async fn the_user_roles_grant_what_docs_user_rbac_md_says() {
    let env = env_with_crds().await.unwrap();
    let out = env
        .apply_file(repo_root().join("deploy/rbac/user-roles.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    for ns in ["news", "sports", "automanager-system"] {
        ok(&env, &["create", "namespace", ns]).await;
    }
    // As docs/user-rbac.md binds them.
    ok(
        &env,
        &[
            "create",
            "rolebinding",
            "news-edit",
            "--clusterrole=automanager-edit",
            "--group=news-team",
            "-n",
            "news",
        ],
    )
    .await;
    ok(
        &env,
        &[
            "create",
            "clusterrolebinding",
            "news-fleet",
            "--clusterrole=automanager-fleet-view",
            "--group=news-team",
        ],
    )
    .await;
    ok(
        &env,
        &[
            "create",
            "rolebinding",
            "sports-view",
            "--clusterrole=automanager-view",
            "--group=sports-viewers",
            "-n",
            "sports",
        ],
    )
    .await;
    ok(
        &env,
        &[
            "create",
            "clusterrolebinding",
            "ops-fleet",
            "--clusterrole=automanager-fleet-admin",
            "--group=ops",
        ],
    )
    .await;
    ok(
        &env,
        &[
            "create",
            "rolebinding",
            "ops-debug",
            "--clusterrole=automanager-debug",
            "--group=ops",
            "-n",
            "automanager-system",
        ],
    )
    .await;

    let bundles = "bundles.automanager.norsk.io";
    let migrations = "migrations.automanager.norsk.io";
    let cases: &[(&str, &[&str], bool)] = &[
        // A team with automanager-edit in its namespace and the fleet read.
        ("news-team", &["create", bundles, "-n", "news"], true),
        ("news-team", &["patch", bundles, "-n", "news"], true),
        ("news-team", &["delete", bundles, "-n", "news"], true),
        ("news-team", &["create", migrations, "-n", "news"], true),
        ("news-team", &["patch", migrations, "-n", "news"], true),
        (
            "news-team",
            &[
                "get",
                "bundles.automanager.norsk.io",
                "--subresource=status",
                "-n",
                "news",
            ],
            true,
        ),
        (
            "news-team",
            &["patch", bundles, "--subresource=status", "-n", "news"],
            false,
        ),
        ("news-team", &["create", bundles, "-n", "sports"], false),
        ("news-team", &["list", bundles, "-A"], false),
        (
            "news-team",
            &["list", "placementpools.automanager.norsk.io"],
            true,
        ),
        (
            "news-team",
            &["list", "managernodes.automanager.norsk.io"],
            true,
        ),
        (
            "news-team",
            &["list", "hotsparetargets.automanager.norsk.io"],
            true,
        ),
        (
            "news-team",
            &["patch", "managernodes.automanager.norsk.io"],
            false,
        ),
        (
            "news-team",
            &["create", "placementpools.automanager.norsk.io"],
            false,
        ),
        (
            "news-team",
            &[
                "create",
                "pods",
                "--subresource=portforward",
                "-n",
                "automanager-system",
            ],
            false,
        ),
        // Read-only in one namespace.
        ("sports-viewers", &["list", bundles, "-n", "sports"], true),
        (
            "sports-viewers",
            &["watch", migrations, "-n", "sports"],
            true,
        ),
        (
            "sports-viewers",
            &["create", bundles, "-n", "sports"],
            false,
        ),
        ("sports-viewers", &["patch", bundles, "-n", "sports"], false),
        (
            "sports-viewers",
            &["list", "placementpools.automanager.norsk.io"],
            false,
        ),
        // The fleet's owners.
        (
            "ops",
            &["create", "placementpools.automanager.norsk.io"],
            true,
        ),
        (
            "ops",
            &["delete", "hotsparetargets.automanager.norsk.io"],
            true,
        ),
        ("ops", &["patch", "managernodes.automanager.norsk.io"], true),
        (
            "ops",
            &["create", "managernodes.automanager.norsk.io"],
            false,
        ),
        (
            "ops",
            &["delete", "managernodes.automanager.norsk.io"],
            false,
        ),
        (
            "ops",
            &[
                "patch",
                "managernodes.automanager.norsk.io",
                "--subresource=status",
            ],
            false,
        ),
        ("ops", &["create", bundles, "-n", "news"], false),
        (
            "ops",
            &[
                "get",
                "leases.coordination.k8s.io",
                "-n",
                "automanager-system",
            ],
            true,
        ),
        (
            "ops",
            &[
                "create",
                "pods",
                "--subresource=portforward",
                "-n",
                "automanager-system",
            ],
            true,
        ),
        (
            "ops",
            &["create", "pods", "--subresource=portforward", "-n", "news"],
            false,
        ),
        (
            "ops",
            &["get", "secrets", "-n", "automanager-system"],
            false,
        ),
    ];
    let mut wrong = Vec::new();
    for (group, args, want) in cases {
        if can(&env, "someone", group, args).await != *want {
            wrong.push(format!("{group} {args:?}: want {want}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
