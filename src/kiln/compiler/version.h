// The kiln compiler's version string. It is part of every compile-cache key (cache.h) and is
// recorded in exported artifacts (artifact.h), so cached optimized programs never outlive the
// compiler that produced them.
//
//   std::string v(kCompilerVersion);   // "kiln-compiler 0.1.0+opt5"
//
// Bump the "+optN" suffix whenever a pass changes what it produces for some input (a new pass in
// the default pipeline, a changed rewrite rule, a changed decomposition): stale cache entries then
// become misses instead of silently serving the old result.
#ifndef KILN_COMPILER_VERSION_H_
#define KILN_COMPILER_VERSION_H_

namespace kiln::compiler {

inline constexpr char kCompilerVersion[] = "kiln-compiler 0.1.0+opt5";

}  // namespace kiln::compiler

#endif  // KILN_COMPILER_VERSION_H_
