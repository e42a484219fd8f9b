//! `TestVhost`: a vhost and a user of the test's own on the shared broker,
//! for tests that change permissions (which must never touch `/` or
//! `guest`). The user has every permission on the vhost at first, and so
//! has `guest`, which the test's own clients use. Both are deleted by
//! [`TestVhost::delete`] or, if the test fails first, on drop.
//!
//! It also knows one thing about the broker's permission checks that a
//! test of a permission change needs: see
//! [`TestVhost::wait_permission_caches_dropped`].

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use super::{amqp_addr, rabbitmqctl, wait_until_every};

/// A vhost and a user, both named after the test's prefix.
pub struct TestVhost {
    /// The vhost's name (the test's prefix).
    pub name: String,
    /// The user's name (`<prefix>-user`).
    pub user: String,
    password: String,
    deleted: bool,
}

impl TestVhost {
    /// Creates vhost `prefix` and user `<prefix>-user` (a random password),
    /// and gives the user and `guest` every permission on the vhost.
    pub async fn create(prefix: &str) -> Self {
        let vhost = Self {
            name: prefix.to_owned(),
            user: format!("{prefix}-user"),
            password: uuid::Uuid::new_v4().simple().to_string(),
            deleted: false,
        };
        rabbitmqctl(&["add_vhost", &vhost.name]).await;
        rabbitmqctl(&["add_user", &vhost.user, &vhost.password]).await;
        vhost.grant_all().await;
        rabbitmqctl(&[
            "set_permissions",
            "-p",
            &vhost.name,
            "guest",
            ".*",
            ".*",
            ".*",
        ])
        .await;
        vhost
    }

    /// The vhost as its user reaches it.
    pub fn user_url(&self) -> String {
        format!(
            "amqp://{}:{}@{}/{}",
            self.user,
            self.password,
            amqp_addr(),
            self.name
        )
    }

    /// The vhost as `guest` reaches it.
    pub fn guest_url(&self) -> String {
        format!("amqp://guest:guest@{}/{}", amqp_addr(), self.name)
    }

    /// Every permission (configure, write, read) for the user.
    pub async fn grant_all(&self) {
        self.set_permissions(".*", ".*", ".*").await;
    }

    /// The user's `configure`, `write` and `read` patterns on the vhost
    /// (`""` denies all of that kind).
    pub async fn set_permissions(&self, configure: &str, write: &str, read: &str) {
        rabbitmqctl(&[
            "set_permissions",
            "-p",
            &self.name,
            &self.user,
            configure,
            write,
            read,
        ])
        .await;
    }

    /// Removes every permission of the user on the vhost.
    pub async fn clear_permissions(&self) {
        rabbitmqctl(&["clear_permissions", "-p", &self.name, &self.user]).await;
    }

    /// `(messages_ready, messages_unacknowledged)` of `queue` in the vhost,
    /// `None` if the queue is missing.
    pub async fn ready_unacked(&self, queue: &str) -> Option<(u64, u64)> {
        let out = rabbitmqctl(&[
            "list_queues",
            "-p",
            &self.name,
            "--silent",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ])
        .await;
        super::ready_unacked_in(&out, queue)
    }

    /// Waits until every channel the user has open on the vhost has
    /// dropped its permission cache, so that the next publish on it is
    /// checked against the permissions as they are now.
    ///
    /// A RabbitMQ channel remembers the resources it was allowed (up to
    /// twelve) and checks none of them again until its process hibernates,
    /// which it does after about a second without work, longer for a
    /// channel woken often: a channel that keeps publishing keeps
    /// publishing whatever the permissions become. So this waits for each
    /// channel (listed once, which wakes it) to be seen hibernating, as its
    /// Erlang process reports it (`process_info`, which does not wake it);
    /// a channel that has closed needs no wait, and a new one starts with
    /// an empty cache. It is meant for a moment when the user's
    /// connections are idle.
    pub async fn wait_permission_caches_dropped(&self, timeout: Duration) {
        let listed =
            rabbitmqctl(&["list_channels", "-p", &self.name, "--silent", "pid", "user"]).await;
        let pids: Vec<String> = listed
            .lines()
            .filter_map(|line| {
                let (pid, user) = line.split_once('\t')?;
                (user.trim() == self.user && pid.starts_with('<')).then(|| pid.trim().to_owned())
            })
            .collect();
        let quoted: Vec<String> = pids.iter().map(|p| format!("{p:?}")).collect();
        let expression = format!(
            "[case erlang:process_info(rabbit_misc:string_to_pid(P), current_function) of \
             {{current_function, {{erlang, hibernate, 3}}}} -> hibernated; \
             undefined -> gone; _ -> awake end || P <- [{}]].",
            quoted.join(", ")
        );
        let settled = RefCell::new(BTreeSet::new());
        wait_until_every(
            &format!("the channels of {} drop their permission caches", self.user),
            timeout,
            Duration::from_millis(200),
            || {
                let expression = expression.clone();
                let pids = &pids;
                let settled = &settled;
                async move {
                    let out = rabbitmqctl(&["eval", &expression]).await;
                    let states = out.trim().trim_start_matches('[').trim_end_matches(']');
                    let mut settled = settled.borrow_mut();
                    for (pid, state) in pids.iter().zip(states.split(',')) {
                        if state.trim() != "awake" {
                            settled.insert(pid.clone());
                        }
                    }
                    settled.len() == pids.len()
                }
            },
        )
        .await;
    }

    /// Deletes the vhost (and everything in it) and the user.
    pub async fn delete(mut self) {
        rabbitmqctl(&["delete_vhost", &self.name]).await;
        rabbitmqctl(&["delete_user", &self.user]).await;
        self.deleted = true;
    }
}

impl Drop for TestVhost {
    /// A failed test still leaves neither behind.
    fn drop(&mut self) {
        if self.deleted {
            return;
        }
        for args in [
            ["delete_vhost", self.name.as_str()],
            ["delete_user", self.user.as_str()],
        ] {
            let _ = Command::new("rabbitmqctl").args(args).output();
        }
    }
}
