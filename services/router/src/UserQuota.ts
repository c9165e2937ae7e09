/**
 * How many authenticated sockets of one kind each user holds on this replica, against a cap. The
 * edge cannot cap them: on `/mcp` and `/extension` it learns the user only in-band, after the
 * upgrade. Counted in memory, per replica: exact across replicas would cost a KV write per socket.
 */
import * as Effect from "effect/Effect"
import * as Scope from "effect/Scope"

export class UserQuota {
  private readonly held = new Map<string, number>()
  constructor(readonly limit: number) {}

  /**
   * Takes a seat for `user` until `scope` closes; `false`, taking nothing, when the user is at the
   * cap. `force` takes one regardless: a socket adopted from another replica was admitted there.
   */
  take(user: string, scope: Scope.Scope, force = false): Effect.Effect<boolean> {
    return Effect.suspend(() => {
      const count = this.held.get(user) ?? 0
      if (count >= this.limit && !force) return Effect.succeed(false)
      this.held.set(user, count + 1)
      return Scope.addFinalizer(scope, Effect.sync(() => this.release(user))).pipe(Effect.as(true))
    })
  }

  /** Seats `user` holds now. */
  count(user: string): number {
    return this.held.get(user) ?? 0
  }

  private release(user: string) {
    const count = (this.held.get(user) ?? 0) - 1
    // Delete at zero, so users who come and go leave no entries behind.
    if (count <= 0) this.held.delete(user)
    else this.held.set(user, count)
  }
}
