package esfuse.esdev;

import org.elasticsearch.index.analysis.TokenizerFactory;
import org.elasticsearch.indices.analysis.AnalysisModule.AnalysisProvider;
import org.elasticsearch.plugins.AnalysisPlugin;
import org.elasticsearch.plugins.Plugin;

import java.util.Map;

/**
 * Registers the {@code ngram} tokenizer (it lives in the analysis-common module of the
 * Elasticsearch distribution, which is not published on Maven Central).
 */
public class NGramPlugin extends Plugin implements AnalysisPlugin {

    @Override
    public Map<String, AnalysisProvider<TokenizerFactory>> getTokenizers() {
        return Map.of("ngram", NGramTokenizerFactory::new);
    }
}
