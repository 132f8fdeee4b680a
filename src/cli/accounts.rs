//! `accounts`: the registry of many-account sources, through the same
//! [`Operations`](crate::operations::Operations) as the admin API.

use std::process::ExitCode;

use super::{AccountsAction, EXIT_CONFIG, EXIT_FAILED, open_migrated};
use crate::config::Config;

/// `accounts`: the registry of many-account sources.
pub(super) async fn accounts(config: &Config, action: AccountsAction) -> anyhow::Result<ExitCode> {
    use crate::operations::{OpError, Operations};
    let code = |e: &OpError| match e {
        OpError::NotRegistered { .. } => ExitCode::from(EXIT_FAILED),
        e if e.caller_error() => ExitCode::from(EXIT_CONFIG),
        _ => ExitCode::from(EXIT_FAILED),
    };
    // Mistakes of the command are told before the database is opened.
    let (source, account) = match &action {
        AccountsAction::Add {
            source, account, ..
        }
        | AccountsAction::Set {
            source, account, ..
        }
        | AccountsAction::Disable { source, account }
        | AccountsAction::Enable { source, account }
        | AccountsAction::Remove {
            source, account, ..
        } => (Some(source.as_str()), Some(account.as_str())),
        AccountsAction::List { source, .. } => (source.as_deref(), None),
        AccountsAction::Rekey { .. } => (None, None),
    };
    if let Some(source) = source {
        if let Err(e) = Operations::check_account_request(config, source, account) {
            eprintln!("error: {e}");
            return Ok(code(&e));
        }
    }
    let credential = match &action {
        AccountsAction::Add {
            token_file,
            token_env,
            ..
        }
        | AccountsAction::Set {
            token_file,
            token_env,
            ..
        } => match crate::config::secret_from_file_or_env(
            token_file.as_deref(),
            token_env.as_deref(),
        ) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: the account's credential: {e}");
                return Ok(ExitCode::from(EXIT_CONFIG));
            }
        },
        _ => None,
    };
    let db = open_migrated(config).await?;
    let ops = Operations::standalone(std::sync::Arc::new(config.clone()), db);
    let done = match action {
        AccountsAction::Add {
            source,
            account,
            api_base,
            ..
        } => ops
            .add_account(&source, &account, api_base, credential)
            .await
            .map(|()| {
                format!("{source}: account {account} added; its deliveries are applied, and its first sync starts within seconds under `serve`")
            }),
        AccountsAction::List { source, json } => {
            let rows = match ops.accounts(source.as_deref()).await {
                Ok(rows) => rows,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(code(&e));
                }
            };
            if json {
                println!("{}", serde_json::to_string(&rows)?);
            } else if rows.is_empty() {
                println!("no accounts registered");
            } else {
                println!("SOURCE\tACCOUNT\tSTATE\tAPI BASE\tCREDENTIAL\tADDED");
                for r in &rows {
                    let state = match (r.enabled, &r.disabled_reason, &r.disabled_since) {
                        (true, _, _) => "enabled".to_string(),
                        (false, Some(why), Some(since)) => format!("disabled ({why}, since {since})"),
                        (false, Some(why), None) => format!("disabled ({why})"),
                        (false, None, _) => "disabled".to_string(),
                    };
                    println!(
                        "{}\t{}\t{}\t{}\t{}\t{}",
                        r.source,
                        r.account,
                        state,
                        r.api_base.as_deref().unwrap_or("-"),
                        if r.has_credential { "own-credential" } else { "source-credential" },
                        r.created_at
                    );
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        AccountsAction::Set {
            source,
            account,
            api_base,
            clear_api_base,
            ..
        } => {
            let change = crate::accounts::AccessChange {
                api_base: if clear_api_base {
                    Some(None)
                } else {
                    api_base.map(Some)
                },
                credential,
            };
            ops.set_account(&source, &account, change).await.map(|()| {
                format!("{source}: account {account} changed; its next run uses the new access")
            })
        }
        AccountsAction::Rekey { json } => {
            let done = match ops.rekey_accounts().await {
                Ok(done) => done,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Ok(code(&e));
                }
            };
            if json {
                println!("{}", serde_json::to_string(&done)?);
            } else {
                println!(
                    "{} credential(s) re-sealed under accounts.key",
                    done.resealed
                );
                for (source, account, why) in &done.failed {
                    println!("  {source} {account}: left as it was: {why}");
                }
            }
            return Ok(if done.failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_FAILED)
            });
        }
        AccountsAction::Disable { source, account } => ops
            .set_account_enabled(&source, &account, false)
            .await
            .map(|()| format!("{source}: account {account} disabled; its deliveries are answered \"ignored\" and it is not reconciled")),
        AccountsAction::Enable { source, account } => ops
            .set_account_enabled(&source, &account, true)
            .await
            .map(|()| format!("{source}: account {account} enabled; a sync starts within seconds under `serve`")),
        AccountsAction::Remove {
            source,
            account,
            purge,
        } => ops.remove_account(&source, &account, purge).await.map(|r| {
            let done = if r.purged {
                format!("{} rows deleted", r.rows)
            } else {
                format!("{} rows tombstoned (each a change in the feed)", r.rows)
            };
            format!("{source}: account {account} removed; {done}")
        }),
    };
    Ok(match done {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            code(&e)
        }
    })
}
