//! Scaling is not a release, and `pl plan` never promises what the reconciler does otherwise:
//! over generated changes (scales of every environment or of one, new variables, new nodes'
//! worth of replicas), the environments `pl plan` lists as rollouts are exactly those the
//! reconciler gives a new generation, on a real SQLite ledger; every other changed environment
//! keeps its generation.

#[path = "support/apply.rs"]
mod apply;
#[path = "support/dump.rs"]
mod dump;

use apply::{judgement, settle, state_of};
use proptest::prelude::*;
use reconciler::store::Ledger;
use reconciler::store::now_ms;
use state_schema::plan::{Scope, plan_scoped};
use state_schema::synthetic::Params;
use std::collections::{BTreeMap, BTreeSet};

async fn generations(url: &str) -> BTreeMap<String, String> {
    dump::rows(url, "SELECT environment, generation FROM deployments")
        .await
        .into_iter()
        .filter_map(|r| r.split_once('|').map(|(e, g)| (e.to_owned(), g.to_owned())))
        .collect()
}

fn case(base: Params, head: Params) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("l.db").display());
        let ledger = Ledger::connect(&url, 2).await.expect("connect");
        ledger.migrate().await.expect("migrate");
        dump::nodes_up(&url, &dump::SYNTHETIC_NODES).await;
        let (b, h) = (state_of(&base), state_of(&head));
        let plan = plan_scoped(&b.state, &h.state, Scope::Full);
        let promised: BTreeSet<String> = plan.consequences.rollouts.iter().map(|n| n.to_string()).collect();
        let scaled: BTreeSet<String> = plan
            .consequences
            .replicas_changed
            .iter()
            .map(|r| r.environment.to_string())
            .collect();
        ledger
            .apply_revision(
                "main",
                false,
                &mut judgement("a", b),
                now_ms(),
                state_schema::placement::LOST_AFTER_MS,
            )
            .await
            .expect("base");
        settle(&ledger, &url).await;
        let before = generations(&url).await;
        ledger
            .apply_revision(
                "main",
                false,
                &mut judgement("b", h),
                now_ms(),
                state_schema::placement::LOST_AFTER_MS,
            )
            .await
            .expect("head");
        let after = generations(&url).await;
        let rolled: BTreeSet<String> = after
            .iter()
            .filter(|(env, g)| before.get(*env) != Some(*g))
            .map(|(env, _)| env.clone())
            .collect();
        assert_eq!(rolled, promised, "new generations = the plan's rollouts");
        // Environments that only scaled kept their generation.
        for env in scaled.difference(&promised) {
            assert_eq!(before.get(env), after.get(env), "{env} scaled without a release");
        }
        ledger.close().await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn plan_rollouts_are_the_reconcilers_generations(
        replicas in 0u32..3,
        vars in 0u32..2,
        only in proptest::option::of(0usize..20),
    ) {
        let base = Params { per_project: 5, ..Params::new(20) };
        let head = Params { replicas_bump: replicas, vars_bump: vars, only, ..base };
        case(base, head);
    }
}
