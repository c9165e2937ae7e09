/**
 * How an asked request's answer travels over the bus: its `Exit`, as the request's exit Schema
 * encodes it, `{"_tag":"Success","value":...}` or `{"_tag":"Failure","cause":...}`.
 *
 * A success, which is almost every answer, is encoded and decoded with the success Schema alone:
 * the whole exit Schema's union and transformations allocated about 3.5 KB of every edge's
 * handshake to read the `Open`'s empty answer (issue 29). A failure, and whatever the success
 * Schema does not take, go through the whole exit Schema, so what it refuses is refused in its
 * words, as before. The two agree by construction: the exit Schema encodes a success's value with
 * the success Schema and wraps it in `{ _tag, value }`, and `PeerExit.test.ts` holds them to it.
 */
import { JsonRpc } from "@switchboard/protocol"
import * as Either from "effect/Either"
import * as Exit from "effect/Exit"
import type * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"

export interface ExitCodec {
  readonly encode: (exit: Exit.Exit<unknown, unknown>) => Either.Either<string, ParseResult.ParseError>
  readonly decode: (text: string) => Either.Either<Exit.Exit<unknown, unknown>, ParseResult.ParseError>
}

/** What a request class says of its answer (`Schema.TaggedRequest`'s statics). */
export interface RequestClass {
  readonly success: Schema.Schema.AnyNoContext
  readonly failure: Schema.Schema.AnyNoContext
  readonly prototype: object
}

/** The exit Schema's reading, with nothing taken out of its way: the reference the fast path keeps to. */
export const withSchema = ({ failure, success }: Pick<RequestClass, "success" | "failure">): ExitCodec => {
  const json = Schema.parseJson(Schema.Exit({ success, failure, defect: Schema.Defect }))
  return {
    encode: Schema.encodeUnknownEither(json),
    decode: Schema.decodeUnknownEither(json) as ExitCodec["decode"]
  }
}

/** A success's JSON, parsed; undefined for anything else, and for text that is no JSON. */
const successOf = (text: string): { readonly value?: unknown } | undefined => {
  let parsed: unknown
  try {
    parsed = JSON.parse(text)
  } catch {
    return undefined
  }
  return JsonRpc.isRecord(parsed) && parsed["_tag"] === "Success" ? parsed : undefined
}

const make = (result: Pick<RequestClass, "success" | "failure">): ExitCodec => {
  const full = withSchema(result)
  const encodeValue = Schema.encodeUnknownEither(result.success)
  const decodeValue = Schema.decodeUnknownEither(result.success)
  return {
    encode: (exit) => {
      if (Exit.isSuccess(exit)) {
        const value = encodeValue(exit.value)
        if (Either.isRight(value)) {
          try {
            return Either.right(JSON.stringify({ _tag: "Success", value: value.right }))
          } catch {
            // No JSON (a bigint, a cycle): the whole Schema says so.
          }
        }
      }
      return full.encode(exit)
    },
    decode: (text) => {
      const success = successOf(text)
      if (success !== undefined) {
        const value = decodeValue(success.value)
        if (Either.isRight(value)) return Either.right(Exit.succeed(value.right))
      }
      return full.decode(text)
    }
  }
}

const codecs = new WeakMap<object, ExitCodec>()

/** The exit codec of a request class, made once per class. */
export const ofClass = (cls: RequestClass): ExitCodec => {
  let codec = codecs.get(cls.prototype)
  if (codec === undefined) codecs.set(cls.prototype, (codec = make(cls)))
  return codec
}

/** The exit codec of a request's class. */
export const ofRequest = (request: Schema.TaggedRequest.All): ExitCodec => ofClass(request.constructor as unknown as RequestClass)
