#include "sinks/report/explain_report.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/terminal_text.h"
#include "common/units.h"

namespace fragscope::sinks {
namespace {

using analysis::OomExplanation;
using analysis::Remedy;
using analysis::RemedyCheck;
using Json = nlohmann::ordered_json;

std::string B(std::uint64_t bytes) { return FormatBytesLikePyTorch(bytes); }

std::string Where(const OomMessage& m) {
  std::string s = fmt::format("line {}", m.line);
  if (m.gpu) s += fmt::format(", GPU {}", *m.gpu);
  if (m.rank) s += fmt::format(", rank {}", *m.rank);
  return s;
}

std::string WordingText(const OomMessage& m) {
  if (m.backend == "XPU") {  // XPU wordings follow their own allocators, not CUDA's versions
    return m.wording == OomWording::kClassic
               ? "XPU classic wording (Intel Extension for PyTorch's allocator)"
               : "XPU \"total capacity of\" wording (PyTorch's XPU allocator)";
  }
  switch (m.wording) {
    case OomWording::kClassic:
      if (!m.reserved && m.unallocated) {
        return "classic wording with \"cached\" (PyTorch 1.0-1.3: cached = reserved but "
               "unallocated)";
      }
      return m.hint_max_split ? "classic wording with the max_split_size_mb hint (PyTorch 1.10-2.0)"
                              : "classic wording without a hint (PyTorch 1.x before 1.10)";
    case OomWording::kCapacityOf:
      if (m.private_pools) return "\"total capacity of\" wording with private pools (PyTorch 2.4+)";
      return m.hint_expandable
                 ? "\"total capacity of\" wording with the expandable_segments hint (PyTorch 2.2+)"
                 : "\"total capacity of\" wording with the max_split_size_mb hint (PyTorch 2.1)";
    case OomWording::kUnknown:
      break;
  }
  return "no figure list";
}

// `current`: the replay under the job's own settings, when `c` is a remedy's. `what` names the
// replay, `peak` its peak ("peak reserved" for PyTorch's allocator, "peak pool" for the BFC).
std::string CheckText(const RemedyCheck& c, const RemedyCheck* current = nullptr,
                      std::string_view what = "replay", std::string_view peak = "peak reserved") {
  if (!c.oom) return fmt::format("{}: fits, {} {}", what, peak, FormatBytes(c.peak_reserved));
  std::string s = fmt::format("{}: {} at request event {}", what,
                              c.worse ? "worse than the current settings: OOM" : "still OOM",
                              FormatCount(c.oom_event));
  if (c.oom_step >= 0)
    s += fmt::format(" (step {})", FormatCount(static_cast<std::uint64_t>(c.oom_step)));
  if (c.worse && current != nullptr) {
    s += current->oom
             ? fmt::format(", earlier than their event {}", FormatCount(current->oom_event))
             : std::string(", where they fit");
  }
  if (c.fragmentation_at_oom) {
    s += fmt::format(", {:.1f}% of reserved unallocated there", 100.0 * *c.fragmentation_at_oom);
  }
  return s;
}

Json CheckJson(const std::optional<RemedyCheck>& c) {
  if (!c) return nullptr;
  Json j = Json::object();
  j["oom"] = c->oom;
  j["oom_event_index"] = c->oom ? Json(c->oom_event) : Json(nullptr);
  j["oom_step"] = c->oom && c->oom_step >= 0 ? Json(c->oom_step) : Json(nullptr);
  j["peak_reserved_bytes"] = c->peak_reserved;
  j["fragmentation_at_oom"] =
      c->fragmentation_at_oom ? Json(*c->fragmentation_at_oom) : Json(nullptr);
  j["worse_than_current"] = c->worse;
  return j;
}

template <typename T>
Json Opt(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

}  // namespace

std::string RenderExplainText(const analysis::ExplainReport& report) {
  std::string out;
  const std::size_t n = report.errors.size();
  out += fmt::format("fragscope explain: {} ({} lines): {} out-of-memory error{}",
                     report.input == "-" ? "standard input" : TerminalSafe(report.input),
                     report.lines, n, n == 1 ? "" : "s");
  if (n > 1) {
    std::string where;
    for (const OomExplanation& e : report.errors) {
      if (!where.empty()) where += "; ";
      where += e.message.gpu ? fmt::format("GPU {}", *e.message.gpu) : "GPU ?";
      if (e.message.rank) where += fmt::format(" rank {}", *e.message.rank);
      where += fmt::format(" {}", analysis::OomVerdictName(e.verdict));
    }
    out += " (" + where + ")";
  }
  out += "\n";
  if (report.dropped_messages > 0) {
    out += fmt::format("  ({} more distinct messages beyond the limit were not kept)\n",
                       report.dropped_messages);
  }
  if (report.cut_lines > 0) {
    out += fmt::format("  ({} lines longer than 1 MiB were read only up to 1 MiB)\n",
                       report.cut_lines);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const OomExplanation& e = report.errors[i];
    const OomMessage& m = e.message;
    out += fmt::format("\nError {} of {}: {}: {} out of memory{}\n", i + 1, n, Where(m), m.backend,
                       m.exception.empty() ? "" : " (" + TerminalSafe(m.exception) + ")");
    if (m.repeats > 1) {
      std::string lines;
      for (std::uint64_t l : m.repeat_lines) lines += fmt::format(" {}", l);
      out += fmt::format("  repeated {} times (also at line{}{})\n", m.repeats,
                         m.repeat_lines.size() > 1 ? "s" : "", lines);
    }
    out += fmt::format("  wording: {}{}\n", WordingText(m),
                       m.quoted ? " (quoted from \"Tried to allocate\" on)" : "");
    if (e.figures) {
      const analysis::OomFigures& f = *e.figures;
      out += fmt::format("  tried to allocate {}; GPU total {}, free {}\n", B(f.tried), B(f.total),
                         B(f.free));
      out += fmt::format("  PyTorch reserved {} = allocated {} + unallocated {}{}\n", B(f.reserved),
                         B(f.allocated), B(f.unallocated),
                         f.private_pools ? fmt::format(" (allocated includes {} in private pools)",
                                                       B(f.private_pools))
                                         : std::string());
      if (m.this_process) out += fmt::format("  this process in total: {}\n", B(*m.this_process));
      for (const OomProcess& p : m.processes) {
        out += fmt::format("  process {}: {}{}\n", p.pid, B(p.bytes),
                           f.self_pid && *f.self_pid == p.pid ? " (probably this process)" : "");
      }
    }
    out += fmt::format("\n  Verdict: {}\n", e.summary);
    for (const std::string& r : e.reasons) out += "    " + r + "\n";
    if (e.figures && e.figures_agree) {
      out += fmt::format("  Stranded (cached but unusable for this request): {}\n", B(e.stranded));
    }
    if (!e.missing.empty()) {
      std::string list;
      for (const std::string& x : e.missing) list += (list.empty() ? "" : ", ") + x;
      out += fmt::format("  Missing: {}\n", list);
    }
    for (const std::string& note : e.notes) out += "  Note: " + TerminalSafe(note) + "\n";
    const bool verified = report.verification && report.verified_error == i &&
                          report.verification->cannot_rank.empty();
    const RemedyCheck* current = verified ? &report.verification->current : nullptr;
    out += verified ? "\n  Remedies, ranked by the replay:\n" : "\n  Remedies, best first:\n";
    for (std::size_t r = 0; r < e.remedies.size(); ++r) {
      const Remedy& x = e.remedies[r];
      out += fmt::format("    {}. {}\n", r + 1, x.action);
      out += fmt::format("       {}\n", x.why);
      if (x.check) out += fmt::format("       {}\n", CheckText(*x.check, current));
    }
    if (report.verification && report.verified_error == i) {
      const analysis::Verification& v = *report.verification;
      out += fmt::format(
          "\n  Replay of {} ({} request events) on {} with {} used outside PyTorch:\n", v.source,
          FormatCount(v.request_events), FormatBytes(v.options.capacity_bytes),
          FormatBytes(v.options.used_by_others_bytes));
      out += fmt::format("    current settings ({}): {}\n",
                         v.options.current_conf.empty() ? "defaults" : v.options.current_conf,
                         CheckText(v.current));
      if (!v.cannot_rank.empty()) {
        out += "    Remedies not ranked: " + TerminalSafe(v.cannot_rank) + ".\n";
      } else if (!v.reproduced) {
        out +=
            "    The replay does not run out of memory with the current settings, so it does "
            "not reproduce this error (another run, other figures?); the comparison shows "
            "peak reserved memory only.\n";
      }
    }
  }
  return out;
}

namespace {

// The head both explain reports share (PyTorch messages and BFC logs): one schema.
Json ExplainJsonHead(const std::string& input, std::uint64_t lines, std::uint64_t cut_lines,
                     std::uint64_t dropped) {
  Json j = Json::object();
  j["schema"] = kExplainSchemaName;
  j["schema_version"] = kExplainSchemaVersion;
  j["input"] = input;
  j["lines"] = lines;
  j["cut_lines"] = cut_lines;
  j["dropped_messages"] = dropped;
  return j;
}

}  // namespace

std::string RenderExplainJson(const analysis::ExplainReport& report) {
  Json j = ExplainJsonHead(report.input, report.lines, report.cut_lines, report.dropped_messages);
  Json errors = Json::array();
  for (std::size_t i = 0; i < report.errors.size(); ++i) {
    const OomExplanation& e = report.errors[i];
    const OomMessage& m = e.message;
    Json x = Json::object();
    x["line"] = m.line;
    x["last_line"] = m.last_line;
    x["backend"] = m.backend;
    x["exception"] = m.exception.empty() ? Json(nullptr) : Json(m.exception);
    x["gpu"] = Opt(m.gpu);
    x["rank"] = Opt(m.rank);
    x["wording"] = OomWordingName(m.wording);
    x["quoted"] = m.quoted;
    x["repeats"] = m.repeats;
    x["repeat_lines"] = m.repeat_lines;
    x["truncated"] = m.text_truncated;
    Json fig = Json::object();
    fig["tried_bytes"] = Opt(m.tried);
    fig["total_bytes"] = Opt(m.total);
    fig["free_bytes"] = Opt(m.free);
    fig["allocated_bytes"] = Opt(m.allocated);
    fig["reserved_bytes"] = Opt(m.Reserved());
    fig["unallocated_bytes"] = Opt(m.Unallocated());
    fig["private_pools_bytes"] = Opt(m.private_pools);
    fig["allowed_bytes"] = Opt(m.allowed);
    fig["this_process_bytes"] = Opt(m.this_process);
    Json procs = Json::array();
    for (const OomProcess& p : m.processes) {
      procs.push_back({{"pid", p.pid},
                       {"bytes", p.bytes},
                       {"probably_self", e.figures && e.figures->self_pid == p.pid}});
    }
    fig["processes"] = std::move(procs);
    fig["outside_bytes"] = e.figures ? Json(e.figures->outside) : Json(nullptr);
    fig["other_processes_bytes"] = e.figures ? Opt(e.figures->others) : Json(nullptr);
    fig["sysmem_fallback_bytes"] =
        e.figures && e.figures->sysmem_fallback ? Json(e.figures->sysmem_fallback) : Json(nullptr);
    x["figures"] = std::move(fig);
    x["verdict"] = analysis::OomVerdictName(e.verdict);
    x["summary"] = e.summary;
    x["reasons"] = e.reasons;
    const bool measured = e.figures && e.figures_agree;
    x["stranded_bytes"] = measured ? Json(e.stranded) : Json(nullptr);
    x["shortfall_bytes"] = measured ? Json(e.shortfall) : Json(nullptr);
    x["missing"] = e.missing;
    x["notes"] = e.notes;
    Json remedies = Json::array();
    for (const Remedy& r : e.remedies) {
      remedies.push_back({{"id", r.id},
                          {"alloc_conf", r.alloc_conf.empty() ? Json(nullptr) : Json(r.alloc_conf)},
                          {"action", r.action},
                          {"why", r.why},
                          {"replay", CheckJson(r.check)}});
    }
    x["remedies"] = std::move(remedies);
    x["message"] = m.text;
    errors.push_back(std::move(x));
  }
  j["errors"] = std::move(errors);
  if (report.verification) {
    const analysis::Verification& v = *report.verification;
    Json x = {{"source", v.source},
              {"error_index", report.verified_error},
              {"request_events", v.request_events},
              {"capacity_bytes", v.options.capacity_bytes},
              {"used_by_others_bytes", v.options.used_by_others_bytes},
              {"current_alloc_conf", v.options.current_conf},
              {"current", CheckJson(v.current)},
              {"reproduced", v.reproduced}};
    x["cannot_rank"] = v.cannot_rank.empty() ? Json(nullptr) : Json(v.cannot_rank);
    j["verification"] = std::move(x);
  } else {
    j["verification"] = nullptr;
  }
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

// ---- TensorFlow and JAX --------------------------------------------------------------------

namespace {

std::string FrameworkName(const std::string& framework) {
  if (framework == "tensorflow") return "TensorFlow";
  if (framework == "jax") return "JAX";
  return "TensorFlow or JAX";
}

std::string BinRange(int bin) {
  const std::uint64_t lo = std::uint64_t{256} << bin;
  if (bin + 1 >= kBfcNumBins) return fmt::format("[{}, ...)", FormatBytes(lo));
  return fmt::format("[{}, {})", FormatBytes(lo), FormatBytes(lo << 1));
}

analysis::BfcCheckKind BfcCheckKindOf(const analysis::BfcVerification& v, const std::string& id) {
  for (const auto& [remedy, kind] : v.kinds) {
    if (remedy == id) return kind;
  }
  return analysis::BfcCheckKind::kModel;
}

// A remedy's replay in JSON: CheckJson with "method" ("bfc_model" or "live_bytes_bound").
Json BfcCheckJson(const analysis::BfcExplainReport& report, std::size_t error, const Remedy& r) {
  if (!r.check || !report.verification || report.verified_error != error) return nullptr;
  Json j = CheckJson(r.check);
  j["method"] = BfcCheckKindOf(*report.verification, r.id) == analysis::BfcCheckKind::kBound
                    ? "live_bytes_bound"
                    : "bfc_model";
  return j;
}

Json BfcFiguresJson(const analysis::BfcExplanation& e) {
  if (!e.figures) return nullptr;
  const analysis::BfcFigures& f = *e.figures;
  Json j = Json::object();
  j["request_bytes"] = f.request;
  j["limit_bytes"] = f.limit;
  j["pool_bytes"] = f.pool;
  j["in_use_bytes"] = f.in_use;
  j["free_in_pool_bytes"] = f.free_in_pool;
  j["largest_free_chunk_bytes"] = f.largest_known ? Json(f.largest_free) : Json(nullptr);
  j["room_to_grow_bytes"] = f.room;
  j["device_total_bytes"] = Opt(f.device_total);
  return j;
}

}  // namespace

std::string RenderBfcExplainText(const analysis::BfcExplainReport& report) {
  std::string out;
  const std::size_t n = report.errors.size();
  out += fmt::format("fragscope explain: {} ({} lines): {} allocator failure{}",
                     report.input == "-" ? "standard input" : TerminalSafe(report.input),
                     report.lines, n, n == 1 ? "" : "s");
  if (n > 1) {
    std::string where;
    for (const analysis::BfcExplanation& e : report.errors) {
      if (!where.empty()) where += "; ";
      where += fmt::format("line {} {}", e.line, analysis::OomVerdictName(e.verdict));
    }
    out += " (" + where + ")";
  }
  out += "\n";
  if (report.dropped_reports > 0) {
    out += fmt::format("  ({} earlier failures beyond the limit were not kept)\n",
                       report.dropped_reports);
  }
  if (report.soft_failures > 0) {
    out += fmt::format("  ({} failed attempts the caller marked \"not a failure\" were skipped)\n",
                       report.soft_failures);
  }
  if (report.pytorch_messages > 0) {
    out += fmt::format(
        "  ({} PyTorch out-of-memory message{} in the same input: run explain on "
        "them alone)\n",
        report.pytorch_messages, report.pytorch_messages == 1 ? "" : "s");
  }
  for (std::size_t i = 0; i < n; ++i) {
    const analysis::BfcExplanation& e = report.errors[i];
    out += fmt::format("\nError {} of {}: lines {}-{}: {} allocator {}{}\n", i + 1, n, e.line,
                       e.last_line, FrameworkName(e.framework),
                       e.allocator.empty() ? std::string("(unnamed)") : TerminalSafe(e.allocator),
                       i + 1 == n && n > 1 ? " (the last: its chunk map is kept)" : "");
    out += fmt::format("  wording: {}\n", TerminalSafe(e.wording));
    if (e.figures) {
      const analysis::BfcFigures& f = *e.figures;
      out += fmt::format("  request {}; pool {} = in use {} + free {}; limit {}\n", B(f.request),
                         B(f.pool), B(f.in_use), B(f.free_in_pool),
                         f.limit ? B(f.limit) : std::string("unknown"));
      if (f.largest_known) out += fmt::format("  largest free chunk {}\n", B(f.largest_free));
    }
    out += fmt::format("\n  Verdict: {}\n", e.summary);
    for (const std::string& r : e.reasons) out += "    " + r + "\n";
    if (e.figures) {
      out += fmt::format("  Stranded (free in the pool, unusable for this request): {}\n",
                         B(e.stranded));
    }
    if (!e.missing.empty()) {
      std::string list;
      for (const std::string& x : e.missing) list += (list.empty() ? "" : ", ") + x;
      out += fmt::format("  Missing: {}\n", list);
    }
    for (const std::string& note : e.notes) out += "  Note: " + TerminalSafe(note) + "\n";
    if (e.bins) {
      out += "\n  Free chunks by bin (bin i holds chunks from 256 << i bytes):\n";
      for (const analysis::BfcBinUse& b : *e.bins) {
        if (b.chunks == 0) continue;
        out += fmt::format("    bin {:2} {:>22}: {} chunks, {} free ({}), largest free {}\n", b.bin,
                           BinRange(b.bin), FormatCount(b.chunks), FormatCount(b.free_chunks),
                           B(b.free_bytes), B(b.largest_free));
      }
    }
    const analysis::BfcVerification* v =
        report.verification && report.verified_error == i ? &*report.verification : nullptr;
    const bool ranked =
        v != nullptr && std::any_of(e.remedies.begin(), e.remedies.end(),
                                    [](const Remedy& x) { return x.check.has_value(); });
    out += ranked ? "\n  Remedies, ranked by the replay:\n" : "\n  Remedies, best first:\n";
    for (std::size_t r = 0; r < e.remedies.size(); ++r) {
      const Remedy& x = e.remedies[r];
      out += fmt::format("    {}. {}\n", r + 1, x.action);
      out += fmt::format("       {}\n", x.why);
      if (x.check && v != nullptr) {
        const bool bound = BfcCheckKindOf(*v, x.id) == analysis::BfcCheckKind::kBound;
        out += fmt::format(
            "       {}\n",
            bound ? CheckText(*x.check, &v->current,
                              "bound (no pool modelled: live bytes against the same limit)",
                              "peak live")
                  : CheckText(*x.check, &v->current, "replay", "peak pool"));
      }
    }
    if (v != nullptr) {
      out += fmt::format("\n  Replay of {} ({} request events) through the BFC model, limit {}:\n",
                         TerminalSafe(v->source), FormatCount(v->request_events),
                         FormatBytes(v->limit_bytes));
      out += fmt::format("    the job's settings ({}; {}): {}\n",
                         v->current_conf.empty() ? "the model's defaults" : v->current_conf,
                         TerminalSafe(v->current_from),
                         CheckText(v->current, nullptr, "replay", "peak pool"));
      if (!v->reproduced) {
        out +=
            "    The replay does not run out of memory with the job's settings, so it does not "
            "reproduce this failure (another run, other settings?); the comparison shows the "
            "peak pool only.\n";
      }
      for (const std::string& x : v->not_replayed) {
        out += "    Not replayed: " + TerminalSafe(x) + "\n";
      }
    }
  }
  return out;
}

std::string RenderBfcExplainJson(const analysis::BfcExplainReport& report) {
  Json j = ExplainJsonHead(report.input, report.lines, report.cut_lines, report.dropped_reports);
  Json errors = Json::array();
  for (std::size_t i = 0; i < report.errors.size(); ++i) {
    const analysis::BfcExplanation& e = report.errors[i];
    Json x = Json::object();
    x["line"] = e.line;
    x["last_line"] = e.last_line;
    x["framework"] = e.framework.empty() ? Json(nullptr) : Json(e.framework);
    x["allocator"] = e.allocator;
    x["wording"] = e.wording;
    x["figures"] = BfcFiguresJson(e);
    x["verdict"] = analysis::OomVerdictName(e.verdict);
    x["summary"] = e.summary;
    x["reasons"] = e.reasons;
    x["stranded_bytes"] = e.figures ? Json(e.stranded) : Json(nullptr);
    x["shortfall_bytes"] = e.figures ? Json(e.shortfall) : Json(nullptr);
    x["missing"] = e.missing;
    x["notes"] = e.notes;
    Json remedies = Json::array();
    for (const Remedy& r : e.remedies) {
      remedies.push_back({{"id", r.id},
                          {"setting", r.setting.empty() ? Json(nullptr) : Json(r.setting)},
                          {"alloc_conf", nullptr},
                          {"action", r.action},
                          {"why", r.why},
                          {"replay", BfcCheckJson(report, i, r)}});
    }
    x["remedies"] = std::move(remedies);
    Json bins = Json::array();
    if (e.bins) {
      for (const analysis::BfcBinUse& b : *e.bins) {
        bins.push_back({{"bin", b.bin},
                        {"min_bytes", std::uint64_t{256} << b.bin},
                        {"chunks", b.chunks},
                        {"free_chunks", b.free_chunks},
                        {"bytes", b.bytes},
                        {"free_bytes", b.free_bytes},
                        {"largest_free_bytes", b.largest_free}});
      }
    }
    x["bins"] = e.bins ? std::move(bins) : Json(nullptr);
    errors.push_back(std::move(x));
  }
  j["errors"] = std::move(errors);
  if (report.verification) {
    const analysis::BfcVerification& v = *report.verification;
    Json x = {{"source", v.source},
              {"error_index", report.verified_error},
              {"request_events", v.request_events},
              {"capacity_bytes", v.options.capacity_bytes},
              {"used_by_others_bytes", v.options.used_by_others_bytes},
              {"current_alloc_conf", nullptr},
              {"current_bfc_conf", v.current_conf},
              {"current_bfc_conf_from", v.current_from},
              {"limit_bytes", v.limit_bytes},
              {"current", CheckJson(v.current)},
              {"reproduced", v.reproduced},
              {"cannot_rank", nullptr},
              {"not_replayed", v.not_replayed}};
    j["verification"] = std::move(x);
  } else {
    j["verification"] = nullptr;
  }
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace fragscope::sinks
