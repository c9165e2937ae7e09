/**
 * What KV keeps of a connection so that another replica can carry it on: the host's ownership
 * record (which replica holds it, on which edge, and how it was opened) and the service's own
 * session record. Neither write ever fails an actor: a lost record costs only its adoption.
 */
import { Edge } from "@switchboard/protocol"
import * as Effect from "effect/Effect"
import * as Option from "effect/Option"
import * as Schema from "effect/Schema"
import { type KvBucketShape, typed, type TypedBucket } from "./Kv.ts"
import * as Subjects from "./Subjects.ts"

/**
 * An actor's session record in KV, keyed by its connection id: what a replica that adopts the
 * connection reads back (`restored`) to carry on. Saving and forgetting never fail the actor: a
 * lost record costs only the adoption.
 */
export const sessionStore = <A>(bucket: TypedBucket<A>) => ({
  remember: (conn: { readonly id: Subjects.ConnId }, record: A) =>
    bucket.put(Subjects.Key.session(conn.id), record).pipe(Effect.catchAll((e) => Effect.logWarning("could not save session", e))),
  recall: (conn: { readonly id: Subjects.ConnId }) =>
    bucket.get(Subjects.Key.session(conn.id)).pipe(Effect.map(Option.map((s) => s.value)), Effect.orElseSucceed(() => Option.none<A>())),
  forget: (conn: { readonly id: Subjects.ConnId }) =>
    bucket.delete(Subjects.Key.session(conn.id)).pipe(Effect.catchAll((e) => Effect.logWarning("could not forget a closed session", e)))
})

/** An actor record in the `connections` bucket. */
export const ConnectionRecord = Schema.Struct({
  service: Schema.String,
  replica: Schema.String,
  edge: Schema.String,
  /** Everything needed to rebuild the connection on another replica. */
  open: Edge.OpenEvent
})
export type ConnectionRecord = typeof ConnectionRecord.Type

/**
 * A connection record as its Schema encodes it, written by hand (see `Edge.openEventJson`): one
 * is written per connection. `SessionStore.test.ts` holds it to the Schema.
 */
export const encodeConnectionRecord = (r: ConnectionRecord): string =>
  JSON.stringify({ service: r.service, replica: r.replica, edge: r.edge, open: Edge.openEventJson(r.open) })

/** The `connections` bucket, typed. */
export const connectionRecords = (bucket: KvBucketShape): TypedBucket<ConnectionRecord> => typed(bucket, ConnectionRecord, encodeConnectionRecord)

/**
 * The host's ownership records, keyed by connection id. A record names the replica that holds
 * the connection; moving it to another replica is compare-and-set, so that two replicas never
 * both take it.
 */
export const ownership = (bucket: TypedBucket<ConnectionRecord>) => ({
  bucket,
  /** Written before the edge hears "ok", so a replica that dies right after still leaves a record to adopt. */
  record: (conn: Subjects.ConnId, record: ConnectionRecord) =>
    bucket.put(conn, record).pipe(Effect.catchAll((e) => Effect.logWarning("could not record connection ownership", e))),
  /** The connection closed: nobody is to adopt it. */
  remove: (conn: Subjects.ConnId) =>
    bucket.delete(conn).pipe(Effect.catchAll((e) => Effect.logWarning("could not remove a closed connection's record", e))),
  /**
   * Takes a connection that `from` hands over. The record names the replica handing over until
   * this one takes it: a survivor's sweep cannot adopt the connection a second time meanwhile.
   * False when the record is gone or names another replica, or KV fails.
   */
  claim: (conn: string, from: string, replica: string): Effect.Effect<boolean> =>
    bucket.get(conn).pipe(
      Effect.flatMap(Option.match({
        onNone: () => Effect.succeed(false),
        onSome: (found) =>
          found.value.replica !== from
            ? Effect.succeed(false)
            : bucket.update(conn, { ...found.value, replica }, found.revision).pipe(Effect.as(true))
      })),
      Effect.orElseSucceed(() => false)
    )
})
export type Ownership = ReturnType<typeof ownership>
