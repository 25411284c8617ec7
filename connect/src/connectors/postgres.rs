//! The PostgreSQL connectors (tokio-postgres, without TLS: a database beside the connector
//! process, or reached through a tunnel).
//!
//! * **Sink** (`url` required; `table`, default the topic's name with every character but
//!   `[A-Za-z0-9_]` as `_`): the table is made if absent, one row per event:
//!   `(source, id)` the primary key, `type`, `subject`, `time`, `datacontenttype`, `data`
//!   (`jsonb` for JSON data, else `NULL` and the text in `data_text`), `event` (the whole
//!   event, `jsonb`, without the delivery's own extensions). A batch is one `INSERT ... ON
//!   CONFLICT (source, id) DO NOTHING`: an event written before (a redelivery after a crash) is
//!   not written again, so every event is in the table exactly once. A row PostgreSQL refuses
//!   for its data (a `\u0000` in JSON, SQLSTATE class 22) is found by inserting the batch's
//!   rows one by one, and goes to the dead-letter topic; a lost connection is retried.
//! * **Source** (`url`, `table`, `column` required; `poll_ms` = 500): an incremental query on a
//!   monotonic column: `SELECT row_to_json(t) ... WHERE column > <position> ORDER BY column
//!   LIMIT <batch>`. The position is `{"last": "<the last row's value, as text>"}` (cast back
//!   to the column's type). Each row becomes an event with `id = "<table>-<value>"` (the same on
//!   every re-read), `source = "postgres:<table>"`, `type = "evmesh.connect.postgres.row"` and
//!   the row as JSON `data`. As with any incremental query (Kafka Connect's JDBC
//!   "incrementing" mode has it too), a row committed later with a lower value than one already
//!   read (concurrent transactions on a sequence) is not seen, and updates are not seen: use a
//!   column set at commit, or one writer.

use std::time::Duration;

use async_trait::async_trait;
use cloudevents::event::Data;
use cloudevents::{AttributesReader, Event, EventBuilder, EventBuilderV10};
use serde_json::{json, Value};
use tokio_postgres::{Client, NoTls};

use super::{key, only_keys, undelivered, with_position};
use crate::spi::{ConnectError, Position, Sink, SinkError, Source, SourceRecord};

/// `"name"`, with `"` doubled: an identifier as PostgreSQL quotes it.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn url_of(config: &toml::Table) -> Result<String, ConnectError> {
    let url = key(config, "url", toml::Value::as_str, "postgres://user[:password]@host[:port]/database")?
        .ok_or_else(|| ConnectError::Fatal("config.url: the database URL is required".into()))?;
    url.parse::<tokio_postgres::Config>().map_err(|e| ConnectError::Fatal(format!("config.url: {e}")))?;
    Ok(url.to_owned())
}

/// A connection, its driver task spawned (it ends with the client).
async fn connect(url: &str) -> Result<Client, ConnectError> {
    let (client, connection) =
        tokio_postgres::connect(url, NoTls).await.map_err(|e| ConnectError::Transient(format!("postgres: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("evmesh-connect: postgres connection: {e}");
        }
    });
    Ok(client)
}

/// A database error: `Fatal` for what a retry cannot mend (no such table or column,
/// permission), else `Transient`.
fn db_error(what: &str, e: tokio_postgres::Error) -> ConnectError {
    let class = e.code().and_then(|c| c.code().get(..2));
    match class {
        // 42: syntax or access rule violation (undefined table, column, permission).
        Some("42") => ConnectError::Fatal(format!("postgres {what}: {e}")),
        _ => ConnectError::Transient(format!("postgres {what}: {e}")),
    }
}

/// The PostgreSQL sink (see the module doc).
pub struct PostgresSink {
    url: String,
    table: String,
    client: Option<Client>,
}

impl PostgresSink {
    pub fn new(config: &toml::Table, topic: &str) -> Result<PostgresSink, ConnectError> {
        only_keys(config, &["url", "table"])?;
        let table =
            key(config, "table", toml::Value::as_str, "a table name")?.map(str::to_owned).unwrap_or_else(|| {
                topic.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
            });
        if table.is_empty() || table.len() > 63 {
            return Err(ConnectError::Fatal(format!("config.table {table:?}: 1 to 63 characters")));
        }
        Ok(PostgresSink { url: url_of(config)?, table, client: None })
    }

    /// One row's nine values, as text (cast by the statement): source, id, type, subject,
    /// time, datacontenttype, data (JSON data), event, data_text (other data).
    fn row(e: &Event) -> [Option<String>; 9] {
        let e = undelivered(e);
        let (data, text) = match e.data() {
            Some(Data::Json(v)) => (Some(v.to_string()), None),
            Some(Data::String(s)) => (None, Some(s.clone())),
            Some(Data::Binary(b)) => (None, Some(String::from_utf8_lossy(b).into_owned())),
            None => (None, None),
        };
        [
            Some(e.source().to_string()),
            Some(e.id().to_owned()),
            Some(e.ty().to_owned()),
            e.subject().map(str::to_owned),
            e.time().map(|t| t.to_rfc3339()),
            e.datacontenttype().map(str::to_owned),
            data,
            Some(serde_json::to_string(&e).expect("an event serializes")),
            text,
        ]
    }

    /// One `INSERT` of `events`' rows, `ON CONFLICT DO NOTHING`.
    async fn insert(&self, client: &Client, events: &[Event]) -> Result<(), tokio_postgres::Error> {
        let mut sql = format!(
            "INSERT INTO {} (source, id, type, subject, time, datacontenttype, data, event, data_text) VALUES ",
            quoted(&self.table)
        );
        let mut params: Vec<Option<String>> = Vec::with_capacity(events.len() * 9);
        for (i, e) in events.iter().enumerate() {
            let b = i * 9;
            if i > 0 {
                sql.push(',');
            }
            sql.push_str(&format!(
                "(${},${},${},${},${}::text::timestamptz,${},${}::text::jsonb,${}::text::jsonb,${})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5,
                b + 6,
                b + 7,
                b + 8,
                b + 9
            ));
            params.extend(Self::row(e));
        }
        sql.push_str(" ON CONFLICT (source, id) DO NOTHING");
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            params.iter().map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
        client.execute(sql.as_str(), &refs).await.map(|_| ())
    }
}

/// Whether PostgreSQL refused the row itself: its data (class 22), a constraint of the table
/// (23), or its size (54, an index row too large).
fn refused_data(e: &tokio_postgres::Error) -> bool {
    e.code().and_then(|c| c.code().get(..2)).is_some_and(|class| matches!(class, "22" | "23" | "54"))
}

#[async_trait]
impl Sink for PostgresSink {
    async fn open(&mut self) -> Result<(), ConnectError> {
        let client = connect(&self.url).await?;
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {} (source text NOT NULL, id text NOT NULL, type text NOT NULL, subject text, \
             time timestamptz, datacontenttype text, data jsonb, data_text text, event jsonb NOT NULL, \
             PRIMARY KEY (source, id))",
            quoted(&self.table)
        );
        client.batch_execute(&create).await.map_err(|e| db_error("making the table", e))?;
        self.client = Some(client);
        Ok(())
    }

    async fn put(&mut self, events: &[Event]) -> Result<(), SinkError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.open().await?;
        }
        let client = self.client.as_ref().expect("opened above");
        match self.insert(client, events).await {
            Ok(()) => Ok(()),
            Err(e) if refused_data(&e) => {
                // Which row: one by one (those before it are in; ON CONFLICT keeps it once).
                for (i, ev) in events.iter().enumerate() {
                    if let Err(e) = self.insert(client, std::slice::from_ref(ev)).await {
                        return match refused_data(&e) {
                            true => Err(SinkError::Refused { index: i, reason: format!("postgres: {e}") }),
                            false => Err(db_error("insert", e).into()),
                        };
                    }
                }
                Ok(())
            }
            Err(e) => {
                if client.is_closed() {
                    self.client = None;
                }
                Err(db_error("insert", e).into())
            }
        }
    }

    async fn flush(&mut self) -> Result<(), ConnectError> {
        // Each INSERT committed on its own.
        Ok(())
    }

    async fn close(&mut self) {
        self.client = None;
    }
}

/// The PostgreSQL source (see the module doc).
pub struct PostgresSource {
    url: String,
    table: String,
    column: String,
    poll: Duration,
    client: Option<Client>,
    /// The column's type, as the catalog names it (the position is cast back to it).
    ty: String,
    last: Option<String>,
}

impl PostgresSource {
    pub fn new(config: &toml::Table) -> Result<PostgresSource, ConnectError> {
        only_keys(config, &["url", "table", "column", "poll_ms"])?;
        let need = |name: &str| {
            key(config, name, toml::Value::as_str, "a name")?
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| ConnectError::Fatal(format!("config.{name}: required")))
        };
        let poll = key(config, "poll_ms", toml::Value::as_integer, "milliseconds")?.unwrap_or(500);
        if !(10..=3_600_000).contains(&poll) {
            return Err(ConnectError::Fatal(format!("config.poll_ms {poll}: 10 to 3600000")));
        }
        Ok(PostgresSource {
            url: url_of(config)?,
            table: need("table")?,
            column: need("column")?,
            poll: Duration::from_millis(poll as u64),
            client: None,
            ty: String::new(),
            last: None,
        })
    }
}

#[async_trait]
impl Source for PostgresSource {
    async fn open(&mut self, from: Option<Position>) -> Result<(), ConnectError> {
        let client = connect(&self.url).await?;
        let row = client
            .query_opt(
                "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
                 WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT a.attisdropped",
                &[&quoted(&self.table), &self.column],
            )
            .await
            .map_err(|e| db_error("reading the table's columns", e))?;
        let Some(row) = row else {
            return Err(ConnectError::Fatal(format!("postgres: no column {} in table {}", self.column, self.table)));
        };
        self.ty = row.get(0);
        self.last = from.as_ref().and_then(|p| p.get("last")?.as_str().map(str::to_owned));
        self.client = Some(client);
        Ok(())
    }

    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<SourceRecord>, ConnectError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            // The connection was lost: a new one (the column's type is known already).
            self.client = Some(connect(&self.url).await?);
        }
        let client = self.client.as_ref().expect("connected above");
        let (t, c) = (quoted(&self.table), quoted(&self.column));
        let sql = format!(
            "SELECT row_to_json(r)::text, r.{c}::text FROM {t} r WHERE r.{c} IS NOT NULL \
             AND ($1::text IS NULL OR r.{c} > $1::text::{ty}) ORDER BY r.{c} LIMIT {max}",
            ty = self.ty
        );
        let rows = client.query(sql.as_str(), &[&self.last]).await.map_err(|e| db_error("query", e))?;
        if rows.is_empty() {
            tokio::time::sleep(wait.min(self.poll)).await;
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let (Ok(data), Ok(value)) = (row.try_get::<_, String>(0), row.try_get::<_, String>(1)) else { continue };
            let data: Value = serde_json::from_str(&data).unwrap_or(Value::String(data));
            let event = EventBuilderV10::new()
                .id(format!("{}-{value}", self.table))
                .source(format!("postgres:{}", self.table))
                .ty("evmesh.connect.postgres.row")
                .data("application/json", data)
                .build()
                .map_err(|e| ConnectError::Transient(e.to_string()))?;
            let position = json!({ "last": value });
            self.last = Some(value);
            out.push(SourceRecord { event: with_position(event, &position), position });
        }
        Ok(out)
    }

    async fn close(&mut self) {
        self.client = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_as_postgres_quotes_them() {
        assert_eq!(quoted("orders"), "\"orders\"");
        assert_eq!(quoted("a\"; DROP TABLE x; --"), "\"a\"\"; DROP TABLE x; --\"");
    }
}
